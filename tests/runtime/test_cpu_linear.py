"""runtime/cpu_linear.py: the model's linears through oneDNN on a float32 CPU step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from trnfrontier.runtime import cpu_linear, ops
from trnfrontier.runtime.model import GPT, GPTConfig

onednn = pytest.mark.skipif(not cpu_linear.ONEDNN, reason="this torch build has no oneDNN linear")


def _pair(n: int = 96, d_in: int = 64, d_out: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(3, n // 3, d_in, generator=gen), torch.randn(d_out, d_in, generator=gen) * 0.1


@onednn
def test_values_and_gradients_equal_f_linear() -> None:
    x, w = _pair()
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    xb, wb = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = cpu_linear.fast_linear(xa, wa)
    ref = F.linear(xb, wb)
    assert out.shape == ref.shape == (3, 32, 48)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(ref)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wa.grad, wb.grad, rtol=1e-5, atol=1e-5)


@onednn
def test_the_custom_op_runs_for_float32_cpu_only() -> None:
    x, w = _pair()
    assert cpu_linear.onednn_takes(x, w)
    assert not cpu_linear.onednn_takes(x.double(), w.double())  # gradcheck and float64 tests: F.linear
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not cpu_linear.onednn_takes(x, w)  # autocast picks the dtype: F.linear
    with torch.profiler.profile() as prof:
        cpu_linear.fast_linear(x, w)
    assert any(event.name == "trnf::onednn_linear" for event in prof.events())


@onednn
def test_a_model_trains_the_same_through_the_op() -> None:
    config = GPTConfig(vocab_size=64, sequence_len=16, n_layer=2, n_head=2, n_kv_head=2, n_embd=32)
    torch.manual_seed(0)
    model = GPT(config)
    idx = torch.randint(0, 64, (2, 16))
    loss = model.loss(idx, idx)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    ops.register("linear", lambda x, w: F.linear(x, w))
    try:
        reference = model.loss(idx, idx)
        reference.backward()
    finally:
        ops.reset("linear")
    torch.testing.assert_close(loss, reference, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6)


def test_blas_in_the_environment_turns_it_off() -> None:
    code = "from trnfrontier.runtime import cpu_linear; print(cpu_linear.ONEDNN)"
    env = {**os.environ, cpu_linear.MATMUL_ENV: "blas"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


def test_a_second_copy_of_the_module_reuses_the_op() -> None:
    """A flattened train.py defines the op again in a process that imported trnf's runtime."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cpu_linear_copy", cpu_linear.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    x, w = _pair()
    torch.testing.assert_close(copy.fast_linear(x, w), cpu_linear.fast_linear(x, w))
