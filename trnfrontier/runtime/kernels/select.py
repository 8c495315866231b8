"""Pick implementations from the recipe's ``kernels:`` section and wire them into the model.

``use_kernels(cfg["kernels"], device)`` decides, per kernel, ``nki`` or ``reference``:

- ``off``: plain PyTorch (nothing registered);
- ``auto``: the NKI custom op when the device is ``neuron`` and the kernel file loads
  with ``nki``; otherwise plain PyTorch, and one notice lists every kernel that fell back;
- ``on``: the NKI custom op, or :class:`KernelUnavailableError` when it cannot run here.

The chosen custom ops are registered into ``trnfrontier.runtime.ops`` (the model's
dispatch table). Polar Express is the optimizer's, not the model's: ``muon`` looks
``polar_express`` up as a module global at every step, so that global is what is swapped.
``reset_kernels()`` undoes everything.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from .. import ops
from . import backend, custom_ops

# kernel name -> [(ops table entry, ops-compatible function)]
OPS_ENTRIES: dict[str, list[tuple[str, Callable[..., Any]]]] = {
    "relu2": [("relu_squared", custom_ops.relu_squared)],
    "rmsnorm": [("rms_norm", custom_ops.rms_norm)],
    # the model calls ops.rotary_rms_norm on q and k: one fused kernel; apply_rotary alone
    # (rotation only, normalize=False) for any caller that uses the rotation by itself.
    "rope_qknorm": [
        ("rotary_rms_norm", custom_ops.rotary_rms_norm),
        ("apply_rotary", custom_ops.apply_rotary),
    ],
    # model.loss calls ops.softcapped_cross_entropy on the uncapped logits: the kernel
    # applies the cap per vocabulary chunk, so the capped logits are never stored.
    "cross_entropy": [
        ("softcapped_cross_entropy", custom_ops.softcapped_cross_entropy),
        ("cross_entropy", custom_ops.cross_entropy),
    ],
    "attention": [("causal_attention", custom_ops.causal_attention)],
    "polar_express": [],
}


class _Patched:
    muon_polar_express: Callable[..., Any] | None = None


_PATCHED = _Patched()


def register_ops(names: list[str] | tuple[str, ...] = backend.KERNEL_NAMES) -> None:
    """Route the named kernels' model/optimizer pieces through the trnf:: custom ops."""
    from .. import muon

    for name in names:
        for entry, fn in OPS_ENTRIES[name]:
            ops.register(entry, fn)
        if name == "polar_express" and _PATCHED.muon_polar_express is None:
            _PATCHED.muon_polar_express = muon.polar_express
            muon.polar_express = custom_ops.polar_express


def reset_kernels() -> None:
    """Back to plain PyTorch for every op, and forget modes and fallback notices."""
    from .. import muon

    for name in backend.KERNEL_NAMES:
        for entry, _fn in OPS_ENTRIES[name]:
            ops.reset(entry)
    if _PATCHED.muon_polar_express is not None:
        muon.polar_express = _PATCHED.muon_polar_express
        _PATCHED.muon_polar_express = None
    backend.BACKEND.modes.clear()
    backend.BACKEND.warned.clear()
    backend.forget_launchers()


def use_kernels(kernels_cfg: dict[str, str] | None, device: torch.device | str) -> dict[str, str]:
    """Apply a resolved recipe's ``kernels`` section; return ``{kernel: "nki" | "reference"}``.

    Raises KernelUnavailableError for a kernel set to ``on`` that cannot run on ``device``.
    Says once (a KernelFallbackWarning) which ``auto`` kernels fell back to references.
    """
    cfg = dict(kernels_cfg or {})
    unknown = sorted(set(cfg) - set(backend.KERNEL_NAMES))
    if unknown:
        raise ValueError(
            f"kernels: unknown kernel(s) {', '.join(unknown)}; known: {', '.join(backend.KERNEL_NAMES)}"
        )
    # a plain string is read without torch.device(): torch cannot parse "neuron" until
    # torch_neuronx is imported, and this must be able to say so
    device_type = device.split(":")[0] if isinstance(device, str) else device.type
    chosen: dict[str, str] = {}
    fell_back: list[str] = []
    for name in backend.KERNEL_NAMES:
        choice = cfg.get(name, "off")
        backend.set_mode(name, choice)
        if choice == "off":
            chosen[name] = "reference"
            continue
        reason: str | None
        if not backend.wants_kernel(device_type):
            reason = f"device {device_type} has no NKI"
        else:
            reason = backend.kernel_importable(name)
        if reason is None:
            register_ops([name])
            chosen[name] = "nki"
        elif choice == "on":
            raise backend.KernelUnavailableError(
                f"kernels.{name}: on, but the NKI kernel cannot run here ({reason}); "
                f"use kernels.{name}: auto to fall back to the PyTorch reference"
            )
        else:
            chosen[name] = "reference"
            fell_back.append(f"{name} ({reason})")
    if fell_back:
        warnings.warn(
            "kernels set to auto fell back to PyTorch references: " + "; ".join(fell_back),
            backend.KernelFallbackWarning,
            stacklevel=2,
        )
    return chosen
