"""``x @ weight.T`` on the CPU through oneDNN rather than the BLAS torch links (MKL).

PyTorch's CPU wheels send a float32 matmul to MKL's sgemm, which on AMD processors takes
slower code paths than on Intel; oneDNN (also in every x86 wheel) picks its kernels by
the instructions the CPU has. On the 2-core AMD EPYC CI VM (AVX-512), for the shapes of a
small model's step (8,192 tokens, width 256 to 1,024, vocab 8,192), oneDNN's linear ran
at 190-220 GFLOP/s against MKL's 150-180 for the forward and the input gradient; MKL
stays faster for the weight gradient (``grad_out.T @ x``), which therefore stays with it.
``benchmarks/bench_vs_nanochat.py`` measures the whole step; ``TRNF_CPU_MATMUL=blas``
(set before the process starts) turns this off for a comparison or if a CPU disagrees.

``fast_linear(x, weight)`` is the entry point: float32 CPU tensors without autocast go to
the ``trnf::onednn_linear`` custom op (opaque to torch.compile, with its own autograd);
everything else is ``F.linear``. Results equal ``F.linear`` up to float32 summation
order. Runtime layer: torch only.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

MATMUL_ENV = "TRNF_CPU_MATMUL"


def _onednn_usable() -> bool:
    if os.environ.get(MATMUL_ENV, "").strip().lower() == "blas":
        return False
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


ONEDNN = _onednn_usable()


def _onednn_linear_impl(x: Tensor, weight: Tensor) -> Tensor:
    """``x [N, in] @ weight[out, in].T`` by oneDNN (a transposed view is read in place)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")


def _onednn_linear_fake(x: Tensor, weight: Tensor) -> Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def _onednn_linear_setup(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _onednn_linear_backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, Tensor | None]:
    x, weight = ctx.saved_tensors
    grad_x = onednn_linear(grad_out, weight.t()) if ctx.needs_input_grad[0] else None
    grad_w = grad_out.t() @ x if ctx.needs_input_grad[1] else None  # MKL is faster here
    return grad_x, grad_w


def _define_onednn_linear() -> Any:
    """The ``trnf::onednn_linear`` op, defined once per process: a flattened train.py
    carries a copy of this module, and a process may import both."""
    try:
        op = torch.library.custom_op("trnf::onednn_linear", mutates_args=())(_onednn_linear_impl)
    except RuntimeError:  # already defined by the other copy, with its fake and autograd
        return torch.ops.trnf.onednn_linear.default
    op.register_fake(_onednn_linear_fake)
    op.register_autograd(_onednn_linear_backward, setup_context=_onednn_linear_setup)
    return op


onednn_linear = _define_onednn_linear()


def onednn_takes(x: Tensor, weight: Tensor) -> bool:
    """Whether ``fast_linear`` sends this pair to oneDNN."""
    return (
        ONEDNN
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    )


def fast_linear(x: Tensor, weight: Tensor) -> Tensor:
    """``F.linear(x, weight)`` (no bias) for ``x`` [..., in], by oneDNN where it pays."""
    if not onednn_takes(x, weight):
        return F.linear(x, weight)
    flat = x.reshape(-1, x.size(-1))
    return onednn_linear(flat, weight).view(*x.shape[:-1], weight.size(0))
