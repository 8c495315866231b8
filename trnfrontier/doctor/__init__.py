"""`trnf doctor`: the first command on a new machine, as a ladder of checks, cheapest first.

Each rung says what it checked and what it skipped (and why); on a CPU machine every
rung that can run here runs and the Trainium-only ones are named as skipped. The rungs
before "torch device" import no torch (environment.py, local_checks.py); the rest do
(runtime_checks.py), and ``--kernels`` adds each kernel against PyTorch at LNC 1 and 2
(kernel_checks.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATUS_ORDER = ("fail", "warn")


def _cheap_rungs(recipe: Any, env: dict[str, str], dev: Path) -> list[Any]:
    from . import local_checks
    from .environment import MIN_FREE_GIB, environment_checks

    kernels = local_checks.recipe_kernels(recipe)
    environment = environment_checks(recipe.runtime.lnc, recipe.runtime.nproc, kernels, dev, env)
    trainium = next(c for c in environment if c.name == "cores").status != "skip"
    floor = MIN_FREE_GIB if trainium else local_checks.MIN_FREE_GIB_CPU
    return [
        local_checks.check_recipe(recipe),
        *environment,
        local_checks.check_disk(env, Path.cwd() / "runs", floor),
        local_checks.check_dataset(recipe, env),
        local_checks.check_torch_compile_cache(recipe, env),
        local_checks.check_sandbox(),
        local_checks.check_device_holders(dev),
    ]


TORCH_RUNGS = ("torch device", "NKI entry points", "smoke kernel")
TORCH_RUNGS_TIMEOUT_S = 1800  # a cold Neuron compile of the smoke kernel


def _torch_rungs(recipe: Any) -> list[Any]:
    """The rungs that import torch, in a child process: the doctor itself stays torch-free
    (fast, and alive when importing torch-neuronx crashes); a child that dies is one
    failing rung with its last line."""
    import json
    import sys

    from trnfrontier import processes

    from .environment import Check

    cmd = [sys.executable, "-m", "trnfrontier.doctor.runtime_checks"]
    # The smoke kernel launches at the recipe's LNC: the child's runtime must be at it too
    # (a shell at another LNC would show the mismatch as a kernel failure).
    env = {**os.environ, "NEURON_LOGICAL_NC_CONFIG": str(recipe.runtime.lnc)}
    done = processes.run_tree(
        [*cmd, recipe.runtime.device, str(recipe.runtime.lnc)], env=env, timeout=TORCH_RUNGS_TIMEOUT_S
    )
    if done.returncode == 0:
        try:
            return [Check(**row) for row in json.loads(done.stdout.strip().splitlines()[-1])]
        except (ValueError, IndexError, TypeError):
            pass
    if done.timed_out:
        why = f"no answer within {TORCH_RUNGS_TIMEOUT_S} s"
    else:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        why = f"the check process exited {done.returncode}: {tail[:300]}"
    failed = [Check(TORCH_RUNGS[0], "fail", why)]
    return failed + [Check(n, "skip", "", f"after {TORCH_RUNGS[0]} failed") for n in TORCH_RUNGS[1:]]


def report(
    recipe_name: str,
    kernels: bool = False,
    on_rung: Callable[[str], None] | None = None,
    dev: Path = Path("/dev"),
) -> dict[str, Any]:
    """The doctor's JSON document for ``recipe_name``: every rung in order, and with
    ``kernels`` the kernel-against-PyTorch document (``--kernels``)."""
    from trnfrontier.recipes import load_recipe

    from .environment import Check

    recipe = load_recipe(recipe_name)
    env = dict(os.environ)
    say = on_rung or (lambda _name: None)
    rungs = _cheap_rungs(recipe, env, dev)
    say("torch, the device and a smoke kernel")
    rungs += _torch_rungs(recipe)
    doc: dict[str, Any] = {
        "recipe": recipe.name,
        "lnc": recipe.runtime.lnc,
        "nproc": recipe.runtime.nproc,
    }
    if kernels:
        from .kernel_checks import kernel_report

        say("every NKI kernel against its reference at LNC 1 and 2")
        doc["kernels"] = kernel_report(recipe)
        rungs.append(Check("kernels", doc["kernels"]["status"], _kernels_line(doc["kernels"])))
    else:
        rungs.append(
            Check("kernels", "skip", "", "each kernel against PyTorch: run `trnf doctor --kernels`")
        )
    doc["rungs"] = [r.as_dict() for r in rungs]
    statuses = [r.status for r in rungs]
    doc["status"] = next((s for s in STATUS_ORDER if s in statuses), "ok")
    return doc


def _kernels_line(k: dict[str, Any]) -> str:
    bad = [f"{r['kernel']}@LNC{r['lnc']}" for r in k["results"] if r["status"] != "ok"]
    ran = f"{len(k['results'])} kernel run(s) in {k['mode']} mode"
    return f"{ran}; failing: {', '.join(bad)}" if bad else f"{ran}, all within tolerance"
