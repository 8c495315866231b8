"""`trnf doctor`'s rungs that import torch: the device the recipe names, torch-neuronx's
NKI entry points and their signatures, and a 128x128 relu2 smoke kernel.

On a Trainium machine the smoke kernel runs through the real launch path
(``wrap_nki(kernel)[(lnc,)]`` on a ``neuron`` tensor); a failure to wrap or index the
kernel (the API) is told apart from a failure to run it or a wrong result (the
kernel). Elsewhere the same kernel file runs under the NumPy interpreter, which checks
that the files load and obey the NKI rules, and the rung says what it could not check.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .environment import Check

SMOKE_SHAPE = (128, 128)


def check_torch_device(device: str) -> Check:
    """Import torch (timed) and find the recipe's device."""
    start = time.perf_counter()
    import torch

    took = time.perf_counter() - start
    base = f"torch {torch.__version__} imported in {took:.1f} s"
    if device == "cpu":
        return Check("torch device", "ok", f"{base}; cpu with {torch.get_num_threads()} threads")
    if device == "cuda":
        if torch.cuda.is_available():
            return Check("torch device", "ok", f"{base}; {torch.cuda.get_device_name(0)}")
        return Check("torch device", "fail", f"{base}; runtime.device=cuda but no CUDA device")
    from trnfrontier.runtime import devices

    if not any(Path("/dev").glob("neuron[0-9]*")):
        return Check(
            "torch device",
            "skip",
            base,
            "runtime.device=neuron: torch-neuronx and a NeuronCore (not a Trainium machine)",
        )
    try:
        devices.import_neuron()
    except devices.DeviceError as exc:
        return Check("torch device", "fail", f"{base}; {str(exc).splitlines()[0]}")
    if not devices.neuron_available():
        return Check("torch device", "fail", f"{base}; torch-neuronx shows no NeuronCore")
    return Check("torch device", "ok", f"{base}; neuron (torch-neuronx imported)")


def _signature(fn: Any) -> str:
    try:
        return f"{getattr(fn, '__name__', 'fn')}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return f"{getattr(fn, '__name__', 'fn')}(...)"


def check_nki_api() -> Check:
    """torch-neuronx's nki_op and wrap_nki: present, and their signatures as installed."""
    from trnfrontier.runtime.kernels import registration

    version = registration.torch_neuronx_version()
    nki_op = registration._torch_neuronx_attr("nki_op")
    wrap_nki = registration._torch_neuronx_attr("wrap_nki")
    if nki_op is None and wrap_nki is None:
        return Check(
            "NKI entry points",
            "skip",
            f"{version}: no nki_op / wrap_nki",
            "their signatures (the kernels are called directly, outside torch.compile)",
        )
    found = [_signature(f) for f in (nki_op, wrap_nki) if f is not None]
    missing = [n for n, f in (("nki_op", nki_op), ("wrap_nki", wrap_nki)) if f is None]
    status = "warn" if missing else "ok"
    extra = f"; missing: {', '.join(missing)}" if missing else ""
    return Check("NKI entry points", status, f"{version}: {'; '.join(found)}{extra}")


def smoke_on_neuron(lnc: int, device: str = "neuron", kernel_file: Callable[[str], Any] | None = None) -> Check:
    """relu2 on a 128x128 ``device`` tensor through wrap_nki, labelled ``API:`` (wrapping or
    indexing the kernel failed) or ``kernel:`` (running it failed, or it answered wrong).
    ``kernel_file`` loads ``kernels/<name>.py`` (default with the real nki)."""
    import torch

    from trnfrontier.runtime.kernels import backend, references, registration

    x = torch.randn(*SMOKE_SHAPE).to(device)
    call = f"relu2.relu2_fwd[({lnc},)]({SMOKE_SHAPE} float32) under {registration.torch_neuronx_version()}"
    try:
        kernel = (kernel_file or backend.load_kernel_file)("relu2").relu2_fwd
        launcher = registration.neuron_launcher(kernel, (lnc,))
    except Exception as exc:  # noqa: BLE001 - report the API fault, do not hide it
        return Check("smoke kernel", "fail", f"API: wrapping {call}: {_first_line(exc)}")
    start = time.perf_counter()
    try:
        y = launcher(x).cpu()
    except Exception as exc:  # noqa: BLE001
        return Check("smoke kernel", "fail", f"kernel: running {call}: {_first_line(exc)}")
    took = time.perf_counter() - start
    err = float((y - references.relu2(x.cpu())).abs().max())
    if not err <= 1e-5:
        return Check("smoke kernel", "fail", f"kernel: {call} ran in {took:.1f} s but is wrong: max error {err:.1e} (over 1e-5)")
    return Check("smoke kernel", "ok", f"{call}: {took:.1f} s (with compile), max error {err:.1e}")


def _first_line(exc: BaseException) -> str:
    """A compiler's exception as one line: its type and first line (the rest is in its log)."""
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def smoke_in_interpreter(lnc: int, why_not_neuron: str) -> Check:
    """relu2 at 128x128 under the NumPy interpreter: the kernel files load and run."""
    import numpy as np

    from . import kernel_checks

    missing = kernel_checks._interpreter_importable()
    if missing is not None:
        return Check("smoke kernel", "skip", "", f"{missing}; and on a NeuronCore: {why_not_neuron}")
    from kernels.testing import load_kernel_module, versions

    x = np.random.default_rng(0).standard_normal(SMOKE_SHAPE).astype(np.float32)
    version = versions.resolve()
    y = load_kernel_module("relu2").relu2_fwd[lnc](x)
    err = float(np.abs(y - np.maximum(x, 0) ** 2).max())
    return Check(
        "smoke kernel",
        "ok" if err <= 1e-6 else "fail",
        f"relu2 {SMOKE_SHAPE} at LNC {lnc} under the NumPy interpreter (NKI {version.name} "
        f"rules): max error {err:.1e}",
        f"the NeuronCore launch (wrap_nki, compile, run): {why_not_neuron}",
    )


def rungs(device: str, lnc: int) -> list[Check]:
    """The torch rungs in ladder order (run in a child process: see doctor.report)."""
    from . import kernel_checks

    found = [check_torch_device(device), check_nki_api()]
    why_not = kernel_checks.neuron_unusable()
    found.append(smoke_on_neuron(lnc) if why_not is None else smoke_in_interpreter(lnc, why_not))
    return found


def main(argv: list[str]) -> int:
    """``python -m trnfrontier.doctor.runtime_checks DEVICE LNC``: one JSON list of rungs
    on the last line of stdout."""
    import json
    import sys

    sys.stdout.write(json.dumps([c.as_dict() for c in rungs(argv[0], int(argv[1]))]) + "\n")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
