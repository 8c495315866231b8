"""How the ``trnf::`` ops and their NKI kernels are registered and launched.

TorchNeuron (torch-neuronx, the native ``neuron`` device) documents one route for NKI
kernels inside ``torch.compile(backend="neuron")``: the op is registered with
``torch_neuronx.nki_op`` and calls its kernels through ``wrap_nki(kernel)[grid](...)``, a
higher-order op the Neuron backend lowers into the compiled graph (a plain
``torch.library.custom_op`` calling a raw ``@nki.jit`` function is opaque to dynamo).
Where torch-neuronx does not provide them (CPU, tests, older releases), the ops are
ordinary ``torch.library.custom_op``s and kernels are called directly.

Every kernel is launched on the LNC grid, ``kernel[lnc]``: with LNC=2 the kernel's two
programs run on the two physical cores of the logical core and split the work with
``nl.program_id`` (a kernel launched without the grid under LNC=2 is a runtime error).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch

LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
DEFAULT_LNC = 2  # Trn2's default logical core: two physical NeuronCores


def _torch_neuronx_attr(name: str) -> Any:
    """``torch_neuronx.<name>``, else ``torch_neuronx.nki_hop.<name>``, else None.

    Literal imports only: a packaged train.py inlines this module, and the static screen
    refuses imports it cannot read."""
    if importlib.util.find_spec("torch_neuronx") is None:
        return None
    try:
        import torch_neuronx
    except Exception:  # noqa: BLE001 - a broken or placeholder install: no wrapper
        return None
    found = getattr(torch_neuronx, name, None)
    if found is not None:
        return found
    try:
        from torch_neuronx import nki_hop
    except Exception:  # noqa: BLE001
        return None
    return getattr(nki_hop, name, None)


def op_decorator() -> tuple[str, Callable[..., Any]]:
    """("nki_op" | "custom_op", decorator factory taking (name, mutates_args=...))."""
    nki_op = _torch_neuronx_attr("nki_op")
    if nki_op is not None:
        return "nki_op", nki_op
    return "custom_op", torch.library.custom_op


def lnc() -> int:
    """The logical-core degree kernels are launched with (``NEURON_LOGICAL_NC_CONFIG``)."""
    raw = os.environ.get(LNC_ENV, str(DEFAULT_LNC))
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{LNC_ENV}={raw!r}: expected 1 or 2") from None
    if value not in (1, 2):
        raise ValueError(f"{LNC_ENV}={value}: expected 1 or 2 (Trn2)")
    return value


def torch_neuronx_version() -> str:
    """``torch-neuronx X.Y.Z`` as installed (package metadata, no import), for messages."""
    try:
        return f"torch-neuronx {metadata.version('torch-neuronx')}"
    except metadata.PackageNotFoundError:
        return "torch-neuronx not installed"


def neuron_launcher(kernel: Any, grid: tuple[int, ...]) -> Any:
    """``wrap_nki(kernel)[grid]`` where TorchNeuron has it, else the raw ``kernel[grid]``.

    The grid is always a tuple: one stored torch-neuronx converts it with
    ``tuple(map(int, grid))``, which raises on a bare int. Wrapping re-traces the kernel
    and registers it anew, so ``backend.run`` calls this once per (kernel, LNC, static
    shape) and keeps the result."""
    wrap_nki = _torch_neuronx_attr("wrap_nki")
    wrapped = wrap_nki(kernel) if wrap_nki is not None else kernel
    return wrapped[tuple(grid)]
