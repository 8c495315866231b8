"""The ``trnf::*`` custom ops: one per kernel (plus its backward), with autograd.

Each op runs its NKI kernel for tensors on a kernel device (``neuron``; see
``backend.kernel_backend`` for how tests substitute the interpreter) when the kernel
supports the shapes, and the PyTorch reference from ``references`` everywhere else.
Backward passes are ops too, so they take the same route:

| op                   | forward           | backward                                   |
| -------------------- | ----------------- | ------------------------------------------ |
| trnf::relu2          | kernel            | kernel (trnf::relu2_backward)              |
| trnf::rmsnorm        | kernel (+rstd)    | kernel (trnf::rmsnorm_backward)            |
| trnf::rope_qknorm    | kernel (+rstd)    | kernel (trnf::rope_qknorm_backward)        |
| trnf::cross_entropy  | kernel (+lse)     | kernel (trnf::cross_entropy_backward)      |
| trnf::attention      | kernel (+lse)     | kernel (trnf::attention_backward)          |
| trnf::polar_express  | kernel            | none (the optimizer runs it under no_grad) |

The auxiliary outputs (rstd, lse) are saved for the backward and are not differentiable.
The plain functions at the bottom have ``trnfrontier.runtime.ops`` signatures; they are
what ``use_kernels`` registers into the model's dispatch table.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..muon import polar_dtype, polar_express_coeffs

# Bound at import, before the kernels layer swaps muon.polar_express for this module's.
from ..muon import polar_express as plain_polar_express
from . import backend, references, registration

# torch_neuronx.nki_op where TorchNeuron provides it (kernels inside torch.compile), else
# torch.library.custom_op; see registration.py
OP_REGISTRATION, _OP = registration.op_decorator()

# ---------------------------------------------------------------- routing


def _shape_text(*tensors: Tensor) -> str:
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}" for t in tensors)


def _use_kernel(op: str, tensors: tuple[Tensor, ...], check: Callable[[], str | None]) -> bool:
    """True when op should run its NKI kernel for these tensors (see backend.fallback)."""
    if not backend.wants_kernel(tensors[0].device.type):
        return False
    reason = backend.kernel_importable(op) or check()
    if reason is None:
        return True
    backend.fallback(op, _shape_text(*tensors), reason)
    return False


def _rows(x: Tensor) -> Tensor:
    return x.reshape(-1, x.shape[-1]).contiguous()


# ---------------------------------------------------------------- relu2


def _relu2_ok(x: Tensor) -> Callable[[], str | None]:
    return lambda: backend.supports_relu2(tuple(x.shape), x.dtype)


@_OP("trnf::relu2", mutates_args=())
def relu2_op(x: Tensor) -> Tensor:
    if _use_kernel("relu2", (x,), _relu2_ok(x)):
        y = backend.run("relu2", "relu2", "relu2_fwd", _rows(x))
        if y is not None:
            return y.reshape(x.shape)
    return references.relu2(x)


@_OP("trnf::relu2_backward", mutates_args=())
def relu2_backward_op(x: Tensor, dy: Tensor) -> Tensor:
    if _use_kernel("relu2", (x, dy), _relu2_ok(x)):
        dx = backend.run("relu2", "relu2", "relu2_bwd", _rows(x), _rows(dy.to(x.dtype)))
        if dx is not None:
            return dx.reshape(x.shape)
    return references.relu2_backward(x, dy)


@relu2_op.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


@relu2_backward_op.register_fake
def _(x: Tensor, dy: Tensor) -> Tensor:
    return torch.empty_like(x)


def _relu2_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])


def _relu2_bwd(ctx, dy):
    (x,) = ctx.saved_tensors
    return relu2_backward_op(x, dy)


relu2_op.register_autograd(_relu2_bwd, setup_context=_relu2_setup)

# ---------------------------------------------------------------- rmsnorm


def _rmsnorm_ok(x: Tensor) -> Callable[[], str | None]:
    return lambda: backend.supports_rmsnorm(tuple(x.shape), x.dtype)


@_OP("trnf::rmsnorm", mutates_args=())
def rmsnorm_op(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    if _use_kernel("rmsnorm", (x,), _rmsnorm_ok(x)):
        out = backend.run("rmsnorm", "rmsnorm", "rmsnorm_fwd", _rows(x), eps)
        if out is not None:
            return out[0].reshape(x.shape), out[1].reshape(*x.shape[:-1], 1)
    return references.rmsnorm(x, eps)


@_OP("trnf::rmsnorm_backward", mutates_args=())
def rmsnorm_backward_op(x: Tensor, dy: Tensor, rstd: Tensor) -> Tensor:
    if _use_kernel("rmsnorm", (x, dy), _rmsnorm_ok(x)):
        dx = backend.run(
            "rmsnorm",
            "rmsnorm",
            "rmsnorm_bwd",
            _rows(x),
            _rows(dy.to(x.dtype)),
            rstd.reshape(-1, 1).float().contiguous(),
        )
        if dx is not None:
            return dx.reshape(x.shape)
    return references.rmsnorm_backward(x, dy, rstd)


@rmsnorm_op.register_fake
def _(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=references.acc_dtype(x))


@rmsnorm_backward_op.register_fake
def _(x: Tensor, dy: Tensor, rstd: Tensor) -> Tensor:
    return torch.empty_like(x)


def _rmsnorm_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0], output[1])
    ctx.mark_non_differentiable(output[1])


def _rmsnorm_bwd(ctx, dy, _drstd):
    x, rstd = ctx.saved_tensors
    return rmsnorm_backward_op(x, dy, rstd), None


rmsnorm_op.register_autograd(_rmsnorm_bwd, setup_context=_rmsnorm_setup)

# ---------------------------------------------------------------- rope + qk-norm


def _positions_major(x: Tensor) -> Tensor:
    """[B, H, T, D] as the kernel's [B, T, H, D]: free for the model's q and k (views of a
    [B, T, H, D] tensor), a copy only for another layout."""
    return x.transpose(1, 2).contiguous()


def _like(y: Tensor, x: Tensor) -> Tensor:
    """The kernel's [B, T, H, D] result as [B, H, T, D] with x's strides (the fake's)."""
    out = y.transpose(1, 2)
    return out if out.stride() == x.stride() else out.contiguous()


def _rope_ok(x: Tensor, cos: Tensor) -> Callable[[], str | None]:
    return lambda: backend.supports_rope_qknorm(tuple(x.shape), x.dtype, cos.shape[0])


@_OP("trnf::rope_qknorm", mutates_args=())
def rope_qknorm_op(
    x: Tensor, cos: Tensor, sin: Tensor, eps: float, normalize: bool
) -> tuple[Tensor, Tensor]:
    """x [B, H, T, D], cos/sin [>=T, D/2] -> (y, rstd [B, H, T, 1])."""
    t = x.shape[-2] if x.dim() >= 2 else 0
    if _use_kernel("rope_qknorm", (x,), _rope_ok(x, cos)):
        c, s = cos[:t].float().contiguous(), sin[:t].float().contiguous()
        out = backend.run(
            "rope_qknorm", "rope_qknorm", "rope_qknorm_fwd", _positions_major(x), c, s, eps, normalize
        )
        if out is not None:  # the kernel's rstd is [B, T, H]: one small store per tile
            return _like(out[0], x), out[1].permute(0, 2, 1).unsqueeze(-1).contiguous()
    return references.rope_qknorm(x, cos[:t], sin[:t], eps, normalize)


@_OP("trnf::rope_qknorm_backward", mutates_args=())
def rope_qknorm_backward_op(
    x: Tensor, dy: Tensor, cos: Tensor, sin: Tensor, rstd: Tensor, normalize: bool
) -> Tensor:
    t = x.shape[-2]
    if _use_kernel("rope_qknorm", (x, dy), _rope_ok(x, cos)):
        c, s = cos[:t].float().contiguous(), sin[:t].float().contiguous()
        dx = backend.run(
            "rope_qknorm",
            "rope_qknorm",
            "rope_qknorm_bwd",
            _positions_major(x),
            _positions_major(dy.to(x.dtype)),
            c,
            s,
            rstd.float().squeeze(-1).transpose(1, 2).contiguous(),  # [B, T, H]
            normalize,
        )
        if dx is not None:
            return _like(dx, x)
    return references.rope_qknorm_backward(x, dy, cos[:t], sin[:t], rstd, normalize)


@rope_qknorm_op.register_fake
def _(x: Tensor, cos: Tensor, sin: Tensor, eps: float, normalize: bool) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=references.acc_dtype(x))


@rope_qknorm_backward_op.register_fake
def _(x: Tensor, dy: Tensor, cos: Tensor, sin: Tensor, rstd: Tensor, normalize: bool) -> Tensor:
    return torch.empty_like(x)


def _rope_setup(ctx, inputs, output) -> None:
    x, cos, sin, _eps, normalize = inputs
    ctx.save_for_backward(x, cos, sin, output[1])
    ctx.normalize = normalize
    ctx.mark_non_differentiable(output[1])


def _rope_bwd(ctx, dy, _drstd):
    x, cos, sin, rstd = ctx.saved_tensors
    return rope_qknorm_backward_op(x, dy, cos, sin, rstd, ctx.normalize), None, None, None, None


rope_qknorm_op.register_autograd(_rope_bwd, setup_context=_rope_setup)

# ---------------------------------------------------------------- softcapped cross-entropy


def _targets_f32(targets: Tensor) -> Tensor:
    return targets.reshape(-1, 1).to(torch.float32).contiguous()


def _ce_ok(logits: Tensor) -> Callable[[], str | None]:
    return lambda: backend.supports_cross_entropy(tuple(logits.shape), logits.dtype)


@_OP("trnf::cross_entropy", mutates_args=())
def cross_entropy_op(logits: Tensor, targets: Tensor, softcap: float) -> tuple[Tensor, Tensor]:
    """logits [N, V], targets [N] (int, < 0 ignored) -> (loss [N], lse [N]) float32."""
    if _use_kernel("cross_entropy", (logits,), _ce_ok(logits)):
        out = backend.run(
            "cross_entropy",
            "cross_entropy",
            "cross_entropy_fwd",
            logits.contiguous(),
            _targets_f32(targets),
            softcap,
        )
        if out is not None:
            return out[0].reshape(-1), out[1].reshape(-1)
    return references.cross_entropy(logits, targets, softcap)


@_OP("trnf::cross_entropy_backward", mutates_args=())
def cross_entropy_backward_op(
    logits: Tensor, targets: Tensor, lse: Tensor, dloss: Tensor, softcap: float
) -> Tensor:
    if _use_kernel("cross_entropy", (logits,), _ce_ok(logits)):
        dz = backend.run(
            "cross_entropy",
            "cross_entropy",
            "cross_entropy_bwd",
            logits.contiguous(),
            _targets_f32(targets),
            lse.reshape(-1, 1).float().contiguous(),
            dloss.reshape(-1, 1).float().contiguous(),
            softcap,
        )
        if dz is not None:
            return dz
    return references.cross_entropy_backward(logits, targets, lse, dloss, softcap)


@cross_entropy_op.register_fake
def _(logits: Tensor, targets: Tensor, softcap: float) -> tuple[Tensor, Tensor]:
    stat = references.acc_dtype(logits)
    n = logits.shape[0]
    return logits.new_empty((n,), dtype=stat), logits.new_empty((n,), dtype=stat)


@cross_entropy_backward_op.register_fake
def _(logits: Tensor, targets: Tensor, lse: Tensor, dloss: Tensor, softcap: float) -> Tensor:
    return torch.empty_like(logits)


def _ce_setup(ctx, inputs, output) -> None:
    logits, targets, softcap = inputs
    ctx.save_for_backward(logits, targets, output[1])
    ctx.softcap = softcap
    ctx.mark_non_differentiable(output[1])


def _ce_bwd(ctx, dloss, _dlse):
    logits, targets, lse = ctx.saved_tensors
    return cross_entropy_backward_op(logits, targets, lse, dloss, ctx.softcap), None, None


cross_entropy_op.register_autograd(_ce_bwd, setup_context=_ce_setup)

# ---------------------------------------------------------------- attention


def _attention_ok(q: Tensor, k: Tensor) -> Callable[[], str | None]:
    return lambda: backend.supports_attention(tuple(q.shape), tuple(k.shape), q.dtype)


@_OP("trnf::attention", mutates_args=())
def attention_op(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Causal attention, q [B, H, T, D], k/v [B, Hkv, T, D] -> (o, lse [B, H, T, 1] float32)."""
    if _use_kernel("attention", (q, k), _attention_ok(q, k)):
        out = backend.run(
            "attention",
            "attention",
            "attention_fwd",
            q.contiguous(),
            k.to(q.dtype).contiguous(),
            v.to(q.dtype).contiguous(),
            scale,
        )
        if out is not None:
            return out[0], out[1]
    return references.attention(q, k, v, scale), references.attention_lse(q, k, scale)


@_OP("trnf::attention_backward", mutates_args=())
def attention_backward_op(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv): the flash backward kernel (kernels/attention_bwd.py), else the same
    math in PyTorch."""
    if _use_kernel("attention", (q, k), _attention_ok(q, k)) and (
        backend.kernel_importable("attention_bwd") is None
    ):
        dt = q.dtype
        grads = backend.run(
            "attention",
            "attention_bwd",
            "attention_bwd",
            q.contiguous(),
            k.to(dt).contiguous(),
            v.to(dt).contiguous(),
            o.to(dt).contiguous(),
            do.to(dt).contiguous(),
            lse.float().contiguous(),
            scale,
        )
        if grads is not None:
            return grads[0], grads[1].to(k.dtype), grads[2].to(v.dtype)
    return references.attention_backward(q, k, v, o, lse, do, scale)


@attention_op.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(q), q.new_empty((*q.shape[:-1], 1), dtype=references.acc_dtype(q))


@attention_backward_op.register_fake
def _(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention_setup(ctx, inputs, output) -> None:
    q, k, v, scale = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1])
    ctx.scale = scale
    ctx.mark_non_differentiable(output[1])


def _attention_bwd(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(q, k, v, o, lse, do, ctx.scale)
    return dq, dk, dv, None


attention_op.register_autograd(_attention_bwd, setup_context=_attention_setup)

# ---------------------------------------------------------------- polar express


@_OP("trnf::polar_express", mutates_args=())
def polar_express_op(g: Tensor, steps: int, eps: float) -> Tensor:
    """Polar Express of g [..., m, n] (each matrix independently), g's dtype."""
    coeffs = polar_express_coeffs(steps)
    # On a kernel device, work in bfloat16 as trnfrontier.runtime.muon does on accelerators.
    if _use_kernel(
        "polar_express",
        (g,),
        lambda: backend.supports_polar_express(tuple(g.shape), torch.bfloat16, 2),
    ):
        m, n = g.shape[-2:]
        mats = g.reshape(-1, m, n).to(torch.bfloat16)
        tall = m > n
        batch = (mats.mT if tall else mats).contiguous()
        out = backend.run(
            "polar_express", "polar_express", "polar_express_fwd", batch, coeffs, eps
        )
        if out is not None:
            return (out.mT if tall else out).reshape(g.shape).to(g.dtype)
    # Elsewhere exactly what Muon does without kernels (its dtype: bfloat16 on a CPU that
    # multiplies it natively, else float32).
    return plain_polar_express(g, steps, eps)


@polar_express_op.register_fake
def _(g: Tensor, steps: int, eps: float) -> Tensor:
    return torch.empty_like(g)


# ---------------------------------------------------------------- ops-compatible functions


def relu_squared(x: Tensor) -> Tensor:
    return relu2_op(x)


def rms_norm(x: Tensor) -> Tensor:
    """As ops.rms_norm: F.rms_norm with eps=None (the dtype's machine epsilon)."""
    return rmsnorm_op(x, references.default_eps(x.dtype))[0]


def _angles(table: Tensor) -> Tensor:
    """The model's [1, 1, T, D/2] cos/sin tables as [T, D/2]."""
    return table.reshape(table.shape[-2], table.shape[-1])


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """As ops.apply_rotary (rotation only; the rope_qknorm kernel with normalize=False)."""
    return rope_qknorm_op(x, _angles(cos), _angles(sin), 0.0, False)[0]


def rotary_rms_norm(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """rms_norm(apply_rotary(x, cos, sin)) in one fused kernel."""
    return rope_qknorm_op(x, _angles(cos), _angles(sin), references.default_eps(x.dtype), True)[0]


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return attention_op(q, k, v, q.size(-1) ** -0.5)[0]


def softcapped_cross_entropy(
    logits: Tensor, targets: Tensor, cap: float, ignore_index: int = -1, reduction: str = "mean"
) -> Tensor:
    """cross_entropy(softcap(logits, cap), targets) without materialising the softcapped logits."""
    flat = logits.reshape(-1, logits.size(-1))
    t = targets.reshape(-1)
    t = torch.where(t == ignore_index, torch.full_like(t, -1), t)
    loss, _lse = cross_entropy_op(flat, t, float(cap))
    if reduction == "none":
        return loss.view(targets.shape)
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.sum() / (t >= 0).sum()
    raise ValueError(f"reduction {reduction!r}: expected mean, sum or none")


def cross_entropy(
    logits: Tensor, targets: Tensor, ignore_index: int = -1, reduction: str = "mean"
) -> Tensor:
    """As ops.cross_entropy (float32 nats; the model has already applied its softcap)."""
    return softcapped_cross_entropy(logits, targets, 0.0, ignore_index, reduction)


def polar_express(G: Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype | None = None) -> Tensor:
    """As trnfrontier.runtime.muon.polar_express (an explicit ``dtype`` other than the
    device's own computes as Muon does, without the kernel)."""
    if dtype is not None and dtype != polar_dtype(G.device):
        return plain_polar_express(G, steps, eps, dtype)
    return polar_express_op(G, steps, eps)
