"""The training loss without full-size logits: lm head + logit softcap + cross-entropy,
fused and chunked over rows.

The plain form ``cross_entropy(cap * tanh((x @ W^T) / cap), targets)`` materialises the
[N, vocab] float32 logits and, in autograd, several more tensors of that size (the
capped logits, the softmax, the gradient), each 268 MB at N = vocab = 8192. Here the
rows are processed ``chunk`` at a time: each chunk's logits, softcap, logsumexp, loss
and gradient are computed together, and the chunk's gradient is pushed through the head
at once (``grad_x`` rows and a ``grad_W`` accumulation). Nothing of size [N, vocab] is
ever allocated, forward or backward.

The gradients are computed in the forward pass (the loss is a mean, so its gradient up
to the incoming scalar is known there); ``backward`` only scales them. This is meant for
the training loss, where a backward always follows: ``linear_softcap_cross_entropy``
uses the plain form when gradients are off or a per-token loss is asked for.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from trnfrontier.runtime import cpu_linear

# Bytes of one [rows, vocab] float32 chunk buffer (two are live at a time). 16 MiB (512
# rows at vocab 8192): the buffers stay in a server CPU's L3 and under glibc's largest mmap
# threshold (32 MiB), so they are reused from the heap rather than mapped and faulted in
# afresh for every chunk; far smaller chunks make the head's matmuls too thin (256 rows
# ran 2x slower than 2048 in eager mode on a 2-core CPU).
CHUNK_BYTES = 16 * 2**20


def chunk_rows(vocab: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk for a vocabulary of ``vocab``: at least one."""
    return max(1, chunk_bytes // (4 * vocab))


def _compute_dtype(x: Tensor, weight: Tensor) -> torch.dtype:
    """The matmul dtype autocast would pick for ``x @ weight.T`` (the weight's otherwise)."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return weight.dtype


class _LinearSoftcapCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, targets: Tensor, cap: float, ignore_index: int, chunk: int
    ) -> Tensor:
        dtype = _compute_dtype(x, weight)
        with torch.autocast(x.device.type, enabled=False):
            w = weight.to(dtype)
            n = x.size(0)
            grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
            acc = torch.promote_types(dtype, torch.float32)  # float64 stays float64 (gradcheck)
            grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
            loss_sum = torch.zeros((), dtype=acc, device=x.device)
            for start in range(0, n, chunk):
                xc = x[start : start + chunk].to(dtype)
                g, loss_c = _chunk_loss_and_grad(xc, w, targets[start : start + chunk], cap, ignore_index)
                loss_sum += loss_c
                g = g.to(dtype)
                grad_x[start : start + chunk] = cpu_linear.fast_linear(g, w.t()).to(x.dtype)
                if grad_w.dtype == dtype:
                    grad_w.addmm_(g.t(), xc)
                else:
                    grad_w += (g.t() @ xc).to(acc)
            count = (targets != ignore_index).sum().clamp_min(1).to(acc)
        ctx.save_for_backward(grad_x, grad_w, count)
        ctx.weight_dtype = weight.dtype
        return loss_sum / count

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        grad_x, grad_w, count = ctx.saved_tensors
        scale = grad_out.to(count.dtype) / count
        return (
            grad_x * scale.to(grad_x.dtype),
            (grad_w * scale).to(ctx.weight_dtype),
            None,
            None,
            None,
            None,
        )


def _chunk_loss_and_grad(
    xc: Tensor, w: Tensor, targets: Tensor, cap: float, ignore_index: int
) -> tuple[Tensor, Tensor]:
    """For one chunk of rows: the summed loss and d(summed loss)/d(uncapped logits).

    In place on two [rows, vocab] float32 buffers: ``t`` (tanh of the scaled logits, then
    the softcap's derivative) and ``p`` (capped logits, then the softmax, then the grad).
    """
    z = cpu_linear.fast_linear(xc, w)
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    valid = targets != ignore_index
    safe = torch.where(valid, targets, torch.zeros_like(targets)).unsqueeze(1)
    if cap > 0:
        t = z.div_(cap).tanh_()
        p = t * cap
    else:
        t, p = None, z
    lse = torch.logsumexp(p, dim=1)
    picked = p.gather(1, safe).squeeze(1)
    mask = valid.to(p.dtype)
    loss = ((lse - picked) * mask).sum()
    # softmax - onehot(target), zero on ignored rows
    p.sub_(lse.unsqueeze(1)).exp_()
    p.scatter_add_(1, safe, torch.full_like(picked, -1.0).unsqueeze(1))
    p.mul_(mask.unsqueeze(1))
    if t is not None:
        p.mul_(t.square_().neg_().add_(1.0))  # d(cap * tanh(z / cap))/dz = 1 - tanh^2
    return p, loss


def linear_softcap_cross_entropy(
    x: Tensor,
    weight: Tensor,
    targets: Tensor,
    cap: float,
    ignore_index: int = -1,
    reduction: str = "mean",
    chunk: int | None = None,
) -> Tensor:
    """Mean cross-entropy (float32 nats) of ``softcap(x @ weight.T)`` against ``targets``;
    ``x`` [..., C], ``weight`` [vocab, C], ``targets`` [...] (``ignore_index`` rows are left
    out). Fused and chunked when it trains (mean reduction, gradients on); otherwise the
    plain form, which also serves ``reduction`` "sum" and "none" (targets' shape)."""
    flat_x = x.reshape(-1, x.size(-1))
    flat_t = targets.reshape(-1)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if reduction == "mean" and needs_grad:
        rows = chunk if chunk is not None else chunk_rows(weight.size(0))
        return _LinearSoftcapCrossEntropy.apply(flat_x, weight, flat_t, float(cap), int(ignore_index), int(rows))
    logits = cpu_linear.fast_linear(flat_x, weight)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if cap > 0:
        logits = cap * torch.tanh(logits / cap)
    loss = F.cross_entropy(logits, flat_t, ignore_index=ignore_index, reduction=reduction)
    return loss.view(targets.shape) if reduction == "none" else loss
