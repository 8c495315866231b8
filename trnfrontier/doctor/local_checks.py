"""`trnf doctor`'s rungs about this machine and the recipe, any machine: the recipe's real
settings, free disk, the prepared dataset, torch's compile cache, the verify sandbox, and
processes holding the Neuron devices. No torch; each returns an environment.Check.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from trnfrontier.runtime.data_home import data_home, data_root_reason

from .environment import Check, kernels_summary

MIN_FREE_GIB_CPU = 2.0  # a CPU recipe's checkpoints, logs and compile cache
TORCH_CACHE_ENVS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")  # runtime/compiling.py


def recipe_kernels(recipe: Any) -> dict[str, str]:
    """The recipe's kernels section as {kernel: off|auto|on}."""
    return {name: str(mode) for name, mode in recipe.kernels.model_dump().items()}


def check_recipe(recipe: Any) -> Check:
    r = recipe.runtime
    return Check(
        "recipe",
        "ok",
        f"{recipe.name}: device {r.device}, dtype {r.dtype}, nproc {r.nproc}, LNC {r.lnc}, "
        f"compile {r.compile}, kernels: {kernels_summary(recipe_kernels(recipe))}",
    )


def _free_gib(path: Path) -> tuple[Path, float]:
    probe = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    return probe, shutil.disk_usage(probe).free / 2**30


def check_disk(env: dict[str, str], run_dir: Path, min_free_gib: float) -> Check:
    """Free disk where runs and the data root write (each filesystem once)."""
    places = {"data root": data_home(env), "runs": run_dir}
    seen: dict[int, str] = {}
    parts, low = [], []
    for label, path in places.items():
        probe, free = _free_gib(path)
        device = probe.stat().st_dev
        if device in seen:
            parts.append(f"{label} {path} (same disk as {seen[device]})")
            continue
        seen[device] = label
        parts.append(f"{label} {path}: {free:.1f} GiB free")
        if free < min_free_gib:
            low.append(f"{label} has {free:.1f} GiB < {min_free_gib:.0f} GiB")
    if low:
        return Check(
            "free disk",
            "warn",
            "; ".join(parts) + "; " + "; ".join(low) + ": a checkpoint or compile may fail",
        )
    return Check("free disk", "ok", "; ".join(parts))


def check_dataset(recipe: Any, env: dict[str, str]) -> Check:
    """The prepared dataset the recipe trains on, found through the trusted prepare.py."""
    from trnfrontier.errors import TrnfError
    from trnfrontier.trusted_prepare import load_contract

    root = f"data root {data_home(env)}, chosen by {data_root_reason(env)}"
    try:
        contract = load_contract()
    except TrnfError as exc:
        return Check("dataset", "fail", str(exc))
    find = getattr(contract.module, "dataset_dir", None)
    if not callable(find):
        return Check(
            "dataset",
            "skip",
            root,
            f"{contract.path} has no dataset_dir(); a kit's prepare.py checks its own data "
            "when `trnf train --train-py` runs it",
        )
    try:
        path = find(recipe.data.dataset)
    except Exception as exc:  # noqa: BLE001 - prepare.PrepareError or a kit's own error type
        # a warning, not a failure: a new machine runs doctor before `trnf prepare`
        return Check("dataset", "warn", f"{exc}; {root}")
    return Check("dataset", "ok", f"{path}; {root}; prepare.py {contract.path}")


def _dir_summary(path: Path) -> str:
    if not path.is_dir():
        return f"{path} (created on the first compile)"
    entries = sum(1 for _ in path.iterdir())
    return f"{path} ({entries} entr{'y' if entries == 1 else 'ies'})"


def check_torch_compile_cache(recipe: Any, env: dict[str, str]) -> Check:
    """torch.compile's caches (runtime/compiling.py puts them under the data root)."""
    setting = recipe.runtime.compile
    eager = setting is False or (recipe.runtime.device == "neuron" and setting is not True)
    if eager:
        return Check(
            "torch compile cache",
            "skip",
            f"runtime.compile={setting} on {recipe.runtime.device}: the step runs eager",
            "the compile caches (unused by this recipe)",
        )
    root = data_home(env) / "compile"
    places = []
    for name, sub in zip(TORCH_CACHE_ENVS, ("inductor", "triton"), strict=True):
        chosen = Path(env[name]) if env.get(name) else root / sub
        places.append(f"{sub} {_dir_summary(chosen)}" + (f" (${name})" if env.get(name) else ""))
    return Check(
        "torch compile cache", "ok", f"runtime.compile={setting}; " + "; ".join(places)
    )


def check_sandbox() -> Check:
    """bubblewrap, which `trnf verify` needs to run archive code."""
    from trnfrontier.untrusted import sandbox

    found = sandbox.available()
    if found.ok:
        return Check("verify sandbox", "ok", found.detail)
    return Check(
        "verify sandbox",
        "warn",
        f"{found.detail}: `trnf verify` cannot run archive code on this machine",
    )


def device_holders(proc: Path = Path("/proc"), me: int | None = None) -> list[tuple[int, str]]:
    """(pid, command) of every other process with a /dev/neuron* file open."""
    me = os.getpid() if me is None else me
    found = []
    for pid_dir in proc.glob("[0-9]*"):
        pid = int(pid_dir.name)
        if pid == me:
            continue
        try:
            links = [os.readlink(fd) for fd in (pid_dir / "fd").iterdir()]
        except OSError:
            continue
        if any(link.startswith("/dev/neuron") for link in links):
            try:
                cmd = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                cmd = "?"
            found.append((pid, cmd[:120] or "?"))
    return sorted(found)


def check_device_holders(dev: Path = Path("/dev"), proc: Path = Path("/proc")) -> Check:
    if not any(dev.glob("neuron[0-9]*")):
        return Check("device holders", "skip", f"no {dev}/neuron*", "not a Trainium machine")
    holders = device_holders(proc)
    if holders:
        shown = "; ".join(f"pid {pid}: {cmd}" for pid, cmd in holders[:5])
        return Check(
            "device holders",
            "warn",
            f"{len(holders)} process(es) hold {dev}/neuron*: {shown}; a leftover run keeps the "
            "cores busy: stop it (kill PID) before training",
        )
    return Check("device holders", "ok", f"no other process has {dev}/neuron* open")
