"""The model's elementwise and fused pieces, behind a tiny dispatch table.

``model.py`` calls only the module-level functions below, never ``torch.nn.functional``
directly for these pieces, so a kernels module can swap in an NKI custom op with
``register("relu_squared", fn)`` without touching the model. ``reset()`` restores the
plain PyTorch implementations (tests use it to compare a kernel with its reference).

Every replacement must keep the reference's signature, shapes, dtype and semantics.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from trnfrontier.runtime import cpu_linear, fused_loss

# ----------------------------------------------------------------------------------------
# Plain PyTorch reference implementations.


def _rms_norm(x: Tensor) -> Tensor:
    """Parameter-free RMSNorm over the last dimension."""
    return F.rms_norm(x, (x.size(-1),))


def _relu_squared(x: Tensor) -> Tensor:
    y = F.relu(x)
    # Without autograd (evaluation), square in place: one activation-sized buffer fewer.
    return y.square() if torch.is_grad_enabled() else y.square_()


def _apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs (i, i + D/2) of ``x`` [B, H, T, D] by the angles whose cos/sin
    are given as [1, 1, T, D/2] (broadcastable)."""
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


def _causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention; q [B, H, T, D], k/v [B, Hkv, T, D] with Hkv dividing H (GQA).

    KV heads are expanded explicitly rather than with ``enable_gqa`` so that every
    backend (including Neuron's) sees a plain multi-head SDPA.
    """
    n_rep = q.size(1) // k.size(1)
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _softcap(logits: Tensor, cap: float) -> Tensor:
    if torch.is_grad_enabled():
        return cap * torch.tanh(logits / cap)
    # Without autograd (evaluation), the same arithmetic in one buffer instead of three.
    return torch.tanh_(logits / cap).mul_(cap)


def _cross_entropy(
    logits: Tensor, targets: Tensor, ignore_index: int = -1, reduction: str = "mean"
) -> Tensor:
    """Cross-entropy in float32 over the last dimension; ``reduction="none"`` keeps the
    targets' shape."""
    loss = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(),
        targets.reshape(-1),
        ignore_index=ignore_index,
        reduction=reduction,
    )
    return loss.view(targets.shape) if reduction == "none" else loss


def _rotary_rms_norm(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # Composed through the table, so a kernel registered for either half still runs
    # when the fused rope_qknorm kernel is off.
    return OPS["rms_norm"](OPS["apply_rotary"](x, cos, sin))


def _softcapped_cross_entropy(
    logits: Tensor, targets: Tensor, cap: float, ignore_index: int = -1, reduction: str = "mean"
) -> Tensor:
    capped = OPS["softcap"](logits, cap) if cap > 0 else logits
    return OPS["cross_entropy"](capped, targets, ignore_index=ignore_index, reduction=reduction)


def _linear_softcapped_cross_entropy(
    x: Tensor, weight: Tensor, targets: Tensor, cap: float, ignore_index: int = -1, reduction: str = "mean"
) -> Tensor:
    """The training loss from the last hidden state: fused and chunked (fused_loss), unless
    a kernel owns the loss pieces (the NKI cross-entropy on Neuron): that kernel then gets
    the head's logits, as before."""
    if all(OPS[name] is _DEFAULTS[name] for name in ("softcapped_cross_entropy", "softcap", "cross_entropy")):
        return fused_loss.linear_softcap_cross_entropy(
            x, weight, targets, cap, ignore_index=ignore_index, reduction=reduction
        )
    logits = F.linear(x, weight).float()
    return OPS["softcapped_cross_entropy"](logits, targets, cap, ignore_index=ignore_index, reduction=reduction)


_DEFAULTS: dict[str, Callable[..., Tensor]] = {
    "linear": cpu_linear.fast_linear,  # x @ weight.T, no bias; oneDNN on a float32 CPU step
    "rms_norm": _rms_norm,
    "relu_squared": _relu_squared,
    "apply_rotary": _apply_rotary,
    "causal_attention": _causal_attention,
    "softcap": _softcap,
    "cross_entropy": _cross_entropy,
    "rotary_rms_norm": _rotary_rms_norm,
    "softcapped_cross_entropy": _softcapped_cross_entropy,
    "linear_softcapped_cross_entropy": _linear_softcapped_cross_entropy,
}

OPS: dict[str, Callable[..., Tensor]] = dict(_DEFAULTS)


def _known(name: str) -> str:
    if name not in _DEFAULTS:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(_DEFAULTS))}")
    return name


def register(name: str, fn: Callable[..., Tensor]) -> None:
    """Replace the implementation of op ``name`` for every model in this process."""
    OPS[_known(name)] = fn


def reset(name: str | None = None) -> None:
    """Restore the plain PyTorch implementation of ``name`` (or of every op)."""
    if name is None:
        OPS.clear()
        OPS.update(_DEFAULTS)
    else:
        OPS[_known(name)] = _DEFAULTS[name]


def reference(name: str) -> Callable[..., Tensor]:
    """The plain PyTorch implementation of ``name`` (what a kernel is tested against)."""
    return _DEFAULTS[name]


# ----------------------------------------------------------------------------------------
# What the model calls. Looked up at call time so that register() takes effect at once.


def linear(x: Tensor, weight: Tensor) -> Tensor:
    return OPS["linear"](x, weight)


def rms_norm(x: Tensor) -> Tensor:
    return OPS["rms_norm"](x)


def relu_squared(x: Tensor) -> Tensor:
    return OPS["relu_squared"](x)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return OPS["apply_rotary"](x, cos, sin)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return OPS["causal_attention"](q, k, v)


def softcap(logits: Tensor, cap: float) -> Tensor:
    return OPS["softcap"](logits, cap)


def cross_entropy(
    logits: Tensor, targets: Tensor, ignore_index: int = -1, reduction: str = "mean"
) -> Tensor:
    return OPS["cross_entropy"](logits, targets, ignore_index=ignore_index, reduction=reduction)


def rotary_rms_norm(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """rms_norm(apply_rotary(x)): what attention does to q and k (one fused kernel when on)."""
    return OPS["rotary_rms_norm"](x, cos, sin)


def softcapped_cross_entropy(
    logits: Tensor, targets: Tensor, cap: float, ignore_index: int = -1, reduction: str = "mean"
) -> Tensor:
    """cross_entropy(softcap(logits, cap)): a fused kernel never stores the capped logits."""
    return OPS["softcapped_cross_entropy"](logits, targets, cap, ignore_index=ignore_index, reduction=reduction)


def linear_softcapped_cross_entropy(
    x: Tensor, weight: Tensor, targets: Tensor, cap: float, ignore_index: int = -1, reduction: str = "mean"
) -> Tensor:
    """softcapped_cross_entropy(x @ weight.T): the head and the loss in one op, so the
    [tokens, vocab] logits need never exist in full (fused_loss)."""
    return OPS["linear_softcapped_cross_entropy"](
        x, weight, targets, cap, ignore_index=ignore_index, reduction=reduction
    )
