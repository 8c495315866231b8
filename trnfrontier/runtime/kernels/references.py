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


def attention_lse(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """logsumexp over keys of the causal, scaled scores, [B, H, T, 1] (float32 or float64):
    what the attention kernel saves for its backward."""
    w = acc_dtype(q)
    n_rep = q.size(1) // k.size(1)
    kk = k.repeat_interleave(n_rep, dim=1) if n_rep > 1 else k
    s = (q.to(w) @ kk.to(w).transpose(-2, -1)) * scale
    t = q.size(-2)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return s.masked_fill(mask, float("-inf")).logsumexp(dim=-1, keepdim=True)


def attention_backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of causal attention from the forward's o and lse, in closed form (the
    flash backward's math, so it runs inside a custom op, where autograd does not)."""
    w = acc_dtype(q)
    hkv, n_rep = k.size(1), q.size(1) // k.size(1)
    kk = (k.repeat_interleave(n_rep, dim=1) if n_rep > 1 else k).to(w)
    vv = (v.repeat_interleave(n_rep, dim=1) if n_rep > 1 else v).to(w)
    qw, dow = q.to(w), do.to(w)
    t = q.size(-2)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    p = torch.exp((qw @ kk.transpose(-2, -1)) * scale - lse.to(w)).masked_fill(mask, 0.0)
    dv = p.transpose(-2, -1) @ dow
    dp = dow @ vv.transpose(-2, -1)
    ds = p * (dp - (dow * o.to(w)).sum(dim=-1, keepdim=True)) * scale
    dq = ds @ kk
    dk = ds.transpose(-2, -1) @ qw

    def per_kv_head(g: Tensor) -> Tensor:  # sum the query heads that share a KV head
        return g.unflatten(1, (hkv, n_rep)).sum(dim=2) if n_rep > 1 else g

    return dq.to(q.dtype), per_kv_head(dk).to(k.dtype), per_kv_head(dv).to(v.dtype)


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
