"""`trnf doctor --kernels`: each NKI kernel against its PyTorch reference, under LNC 1 and 2.

Where Neuron is usable (torch-neuronx shows a core and ``nki`` imports), each LNC runs in
its own process (``NEURON_LOGICAL_NC_CONFIG`` is fixed when the runtime starts) at the
recipe's shapes: compile time (the first call), max error against the reference on the
same device, and the kernel's time against PyTorch's. Elsewhere the kernels run under
the NumPy interpreter at a small slice of the recipe's shapes: that checks the kernels'
rules and numbers (max error) at LNC 1 and 2, not their speed, and the report says so.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from trnfrontier import processes

LNCS = (1, 2)
WORKER_TIMEOUT_S = 1800  # compiling six kernels (forward and backward) from a cold cache
# max |kernel - reference| allowed, relative to max(1, max |reference|)
TOLERANCE = {"float32": 2e-3, "bfloat16": 6e-2}


@contextlib.contextmanager
def lnc_env(lnc: int) -> Iterator[None]:
    """``NEURON_LOGICAL_NC_CONFIG=lnc`` for the kernels launched inside (the launch grid)."""
    saved = os.environ.get("NEURON_LOGICAL_NC_CONFIG")
    os.environ["NEURON_LOGICAL_NC_CONFIG"] = str(lnc)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("NEURON_LOGICAL_NC_CONFIG", None)
        else:
            os.environ["NEURON_LOGICAL_NC_CONFIG"] = saved


def neuron_unusable() -> str | None:
    """None when kernels can run on a NeuronCore here, else why not (one line)."""
    from trnfrontier.runtime import devices

    if importlib.util.find_spec("nki") is None:
        return "the `nki` package is not installed (AWS's Neuron pip repository)"
    try:
        devices.import_neuron()
    except devices.DeviceError as exc:
        return str(exc).split(". ")[0]
    if not devices.neuron_available():
        return "torch-neuronx shows no NeuronCore (not a Trainium machine?)"
    return None


def _run(case: Any, leaves: list[Any]) -> tuple[Any, list[Any]]:
    out = case.fn(*leaves)
    grads: list[Any] = []
    if case.backward:
        import torch

        loss = out.float().square().sum() if out.dim() else out.float()
        grads = list(torch.autograd.grad(loss, [t for t in leaves if t.requires_grad]))
    return out.detach(), grads


def _timed(case: Any, device: Any, repeats: int) -> tuple[Any, list[Any], float, float]:
    """(output, grads, first-call seconds, median seconds of ``repeats`` more calls)."""
    from trnfrontier.runtime import devices

    def leaves() -> list[Any]:
        return [
            t.detach().clone().requires_grad_(case.backward and t.is_floating_point())
            for t in case.inputs
        ]

    start = time.perf_counter()
    out, grads = _run(case, leaves())
    devices.synchronize(device)
    first = time.perf_counter() - start
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        _run(case, leaves())
        devices.synchronize(device)
        samples.append(time.perf_counter() - start)
    samples.sort()
    return out, grads, first, samples[len(samples) // 2] if samples else first


def _max_error(got: Any, want: Any) -> tuple[float, float]:
    """(max |got - want|, max |want|) over the output and every gradient."""
    pairs = [(got[0], want[0]), *zip(got[1], want[1], strict=True)]
    err = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
    scale = max(float(b.float().abs().max()) for _, b in pairs)
    return err, scale


def measure(case: Any, device: Any, dtype_name: str, repeats: int) -> dict[str, Any]:
    """One case: the NKI path (kernels registered for ``case.kernel``) against the reference."""
    from trnfrontier.runtime.kernels import backend, reset_kernels, use_kernels

    try:
        use_kernels({case.kernel: "on"}, device)
        out, grads, first, kernel_s = _timed(case, device, repeats)
    except Exception as exc:  # noqa: BLE001 - one kernel failing must not hide the others
        return {"kernel": case.kernel, "status": "fail", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        reset_kernels()
    with backend.kernel_backend(backend.BACKEND.loader, set()):  # the PyTorch reference
        ref_out, ref_grads, _, ref_s = _timed(case, device, repeats)
    err, scale = _max_error((out, grads), (ref_out, ref_grads))
    tol = TOLERANCE["bfloat16" if case.bf16_inside else dtype_name] * max(1.0, scale)
    return {
        "kernel": case.kernel,
        "status": "ok" if err <= tol else "fail",
        "max_abs_error": err,
        "tolerance": tol,
        "first_call_s": first,
        "kernel_s": kernel_s,
        "reference_s": ref_s,
        "backward": case.backward,
    }


def _interpreter_importable() -> str | None:
    from trnfrontier.runtime.kernels import backend

    root = str(backend.kernels_dir().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        import kernels.testing.torch_bridge  # noqa: F401
    except ImportError as exc:
        return f"the kernel interpreter (kernels/testing) is not importable from {root}: {exc}"
    return None


def interpreter_results(shapes: Any) -> list[dict[str, Any]]:
    """Every kernel under the NumPy interpreter at ``shapes``, at each LNC (float32)."""
    import torch

    from kernels.testing.torch_bridge import interpreted_torch_module
    from trnfrontier.runtime.kernels import backend

    from .kernel_cases import cases

    results = []
    cpu = torch.device("cpu")
    with backend.kernel_backend(interpreted_torch_module, {"cpu"}):
        for lnc in LNCS:
            with lnc_env(lnc):
                for case in cases(shapes, cpu, torch.float32):
                    results.append({"lnc": lnc, **measure(case, cpu, "float32", repeats=0)})
    return results


def neuron_results(shapes: Any, lnc: int) -> list[dict[str, Any]]:
    """Every kernel on this process's NeuronCore (LNC fixed by the environment), bfloat16."""
    import torch

    from trnfrontier.runtime import devices

    from .kernel_cases import cases

    device = devices.resolve_device("neuron", int(os.environ.get("LOCAL_RANK", "0")))
    return [
        {"lnc": lnc, **measure(case, device, "bfloat16", repeats=5)}
        for case in cases(shapes, device, torch.bfloat16)
    ]


def _worker(shapes: Any, lnc: int) -> list[dict[str, Any]]:
    env = {**os.environ, "NEURON_LOGICAL_NC_CONFIG": str(lnc)}
    cmd = [sys.executable, "-m", "trnfrontier.doctor.kernel_worker", json.dumps(shapes.as_dict())]
    # The whole tree goes at the timeout (subprocess.run's timeout kills the direct child only).
    done = processes.run_tree(cmd, env=env, timeout=WORKER_TIMEOUT_S)
    if done.timed_out:
        return [
            {
                "lnc": lnc,
                "kernel": "*",
                "status": "fail",
                "error": f"no result within {WORKER_TIMEOUT_S} s",
            }
        ]
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [
            {
                "lnc": lnc,
                "kernel": "*",
                "status": "fail",
                "error": f"worker exited {done.returncode}: {tail}",
            }
        ]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def kernel_report(recipe: Any) -> dict[str, Any]:
    """The `--kernels` document: what ran, where, what was skipped and why."""
    from .kernel_cases import interpreter_shapes, recipe_shapes

    full = recipe_shapes(recipe)
    why_not = neuron_unusable()
    doc: dict[str, Any] = {"recipe": recipe.name, "recipe_shapes": full.as_dict(), "skipped": []}
    if why_not is None:
        doc.update(mode="neuron", shapes=full.as_dict(), dtype="bfloat16")
        doc["results"] = [r for lnc in LNCS for r in _worker(full, lnc)]
    else:
        small = interpreter_shapes(full)
        doc.update(mode="interpreter", shapes=small.as_dict(), dtype="float32")
        doc["skipped"].append(
            f"compile time and speed against PyTorch, at the recipe's shapes: {why_not}; "
            "the kernels ran under the NumPy interpreter at the small shapes below instead "
            "(its times are not a speed measurement)"
        )
        missing = _interpreter_importable()
        if missing is not None:
            doc["skipped"].append(f"the interpreter run too: {missing}")
            doc["results"] = []
        else:
            doc["results"] = interpreter_results(small)
    failed = [r for r in doc["results"] if r["status"] != "ok"]
    doc["status"] = "fail" if failed else ("ok" if doc["results"] else "skip")
    return doc
