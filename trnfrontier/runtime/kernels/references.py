"""Pure PyTorch references for every kernel: what each NKI kernel must compute.

They compute in float32 (float64 when given float64, so gradcheck can use them) and
return the input's dtype, mirroring the kernels, which do their math in float32 on the
engines. ``trnfrontier.runtime.ops`` holds the model's own plain implementations; the
tests check these against those and against float64 math.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def acc_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def default_eps(dtype: torch.dtype) -> float:
    """F.rms_norm's eps=None: the machine epsilon of the input dtype."""
    return float(torch.finfo(dtype).eps)


def relu2(x: Tensor) -> Tensor:
    return F.relu(x).square()


def relu2_backward(x: Tensor, dy: Tensor) -> Tensor:
    w = acc_dtype(x)
    return (2.0 * F.relu(x.to(w)) * dy.to(w)).to(x.dtype)


def rmsnorm(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(y, rstd): y = x * rstd, rstd = rsqrt(mean(x^2) + eps) over the last dim (rstd keeps a size-1 last dim)."""
    xf = x.to(acc_dtype(x))
    rstd = torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    return (xf * rstd).to(x.dtype), rstd  # rstd stays in the accumulation dtype


def rmsnorm_backward(x: Tensor, dy: Tensor, rstd: Tensor) -> Tensor:
    w = acc_dtype(x)
    xf, gf, rs = x.to(w), dy.to(w), rstd.to(w)
    dot = (xf * gf).mean(dim=-1, keepdim=True)
    return (rs * gf - xf * rs.pow(3) * dot).to(x.dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, inverse: bool = False) -> Tensor:
    """Rotate channel pairs (i, i + D/2) of x [..., T, D] by angles with cos/sin [T, D/2]."""
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    if inverse:
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


def rope_qknorm(
    x: Tensor, cos: Tensor, sin: Tensor, eps: float, normalize: bool
) -> tuple[Tensor, Tensor]:
    """(y, rstd) for y = rmsnorm(rotate(x)) (or rotate(x), rstd = 1, when not normalize)."""
    w = acc_dtype(x)
    z = rotate(x.to(w), cos.to(w), sin.to(w))
    if not normalize:
        return z.to(x.dtype), torch.ones(*x.shape[:-1], 1, dtype=w, device=x.device)
    rstd = torch.rsqrt(z.square().mean(dim=-1, keepdim=True) + eps)
    return (z * rstd).to(x.dtype), rstd


def rope_qknorm_backward(
    x: Tensor, dy: Tensor, cos: Tensor, sin: Tensor, rstd: Tensor, normalize: bool
) -> Tensor:
    w = acc_dtype(x)
    c, s, g = cos.to(w), sin.to(w), dy.to(w)
    if normalize:
        z = rotate(x.to(w), c, s)
        rs = rstd.to(w)
        g = rs * g - z * rs.pow(3) * (z * g).mean(dim=-1, keepdim=True)
    return rotate(g, c, s, inverse=True).to(x.dtype)


def softcapped(logits: Tensor, cap: float) -> Tensor:
    return cap * torch.tanh(logits / cap) if cap > 0 else logits


def cross_entropy(logits: Tensor, targets: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """(loss, lse) per row of logits [N, V]; targets [N] int, < 0 means ignored (loss 0)."""
    s = softcapped(logits.to(acc_dtype(logits)), cap)
    lse = torch.logsumexp(s, dim=-1)
    picked = s.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    loss = torch.where(targets >= 0, lse - picked, torch.zeros_like(lse))
    return loss, lse


def cross_entropy_backward(
    logits: Tensor, targets: Tensor, lse: Tensor, dloss: Tensor, cap: float
) -> Tensor:
    w = acc_dtype(logits)
    z = logits.to(w)
    s = softcapped(z, cap)
    p = torch.exp(s - lse.to(w).unsqueeze(-1))
    p = p - F.one_hot(targets.clamp_min(0), z.size(-1)).to(w)
    g = torch.where(targets >= 0, dloss.to(w), torch.zeros_like(dloss, dtype=w)).unsqueeze(-1)
    dz = p * g
    if cap > 0:
        dz = dz * (1.0 - (s / cap).square())
    return dz.to(logits.dtype)


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Causal attention; q [B, H, T, D], k/v [B, Hkv, T, D] (GQA: Hkv divides H)."""
    n_rep = q.size(1) // k.size(1)
    if n_rep > 1:
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)


def polar_express(g: Tensor, coeffs: tuple[tuple[float, float, float], ...], eps: float) -> Tensor:
    """The Polar Express iteration (as trnfrontier.runtime.muon does it) in float32 (float64 for float64)."""
    x = g.to(acc_dtype(g))
    transposed = x.size(-2) > x.size(-1)
    if transposed:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    for a, b, c in coeffs:
        A = x @ x.mT
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    if transposed:
        x = x.mT
    return x.to(g.dtype)
