"""The fused, chunked head + softcap + cross-entropy against the plain form: values and
gradients, ignored targets, chunk edges, autocast, and no [tokens, vocab] tensor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from trnfrontier.runtime import ops
from trnfrontier.runtime.fused_loss import chunk_rows, linear_softcap_cross_entropy
from trnfrontier.runtime.model import GPT, GPTConfig

N, C, V = 40, 16, 96


def plain(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor, cap: float) -> torch.Tensor:
    logits = F.linear(x, w)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if cap > 0:
        logits = cap * torch.tanh(logits / cap)
    return F.cross_entropy(logits, t, ignore_index=-1)


def inputs(seed: int = 0, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, generator=g, dtype=dtype).requires_grad_()
    # Large enough weights that the softcap bends the logits (|logits| ~ cap).
    w = (3.0 * torch.randn(V, C, generator=g, dtype=dtype)).requires_grad_()
    t = torch.randint(0, V, (N,), generator=g)
    t[::7] = -1  # ignored rows
    return x, w, t


def value_and_grads(fn, x, w, t, cap, **kw):
    x.grad = w.grad = None
    loss = fn(x, w, t, cap, **kw)
    (loss * 1.7).backward()  # a non-unit incoming gradient is scaled through
    return loss.detach(), x.grad.clone(), w.grad.clone()


@pytest.mark.parametrize("cap", [15.0, 2.0, 0.0])
@pytest.mark.parametrize("chunk", [1, 7, 40, 1000])
def test_matches_the_plain_form_in_value_and_gradients(cap: float, chunk: int) -> None:
    x, w, t = inputs()
    expected = value_and_grads(plain, x, w, t, cap)
    got = value_and_grads(linear_softcap_cross_entropy, x, w, t, cap, chunk=chunk)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_gradcheck_float64() -> None:
    x, w, t = inputs(seed=1)
    fn = lambda x, w: linear_softcap_cross_entropy(x, w, t, 3.0, chunk=9)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))


def test_every_target_ignored_gives_zero_loss_and_zero_grads() -> None:
    x, w, t = inputs()
    loss, gx, gw = value_and_grads(linear_softcap_cross_entropy, x, w, torch.full_like(t, -1), 15.0)
    assert loss.item() == 0.0 and not gx.any() and not gw.any()


def test_autocast_bfloat16_is_close_to_float32() -> None:
    x, w, t = (a.detach().float().requires_grad_() if a.is_floating_point() else a for a in inputs())
    expected = value_and_grads(plain, x, w, t, 15.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = value_and_grads(linear_softcap_cross_entropy, x, w, t, 15.0, chunk=16)
    assert got[1].dtype == torch.float32 and got[2].dtype == torch.float32
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.02)


def test_without_gradients_or_per_token_it_is_the_plain_form() -> None:
    x, w, t = inputs()
    with torch.no_grad():
        torch.testing.assert_close(linear_softcap_cross_entropy(x, w, t, 15.0), plain(x, w, t, 15.0))
    per_token = linear_softcap_cross_entropy(x, w, t.view(4, 10), 15.0, reduction="none")
    assert per_token.shape == (4, 10)
    torch.testing.assert_close(per_token.sum() / (t != -1).sum(), plain(x, w, t, 15.0))


class _Sizes(TorchDispatchMode):
    """The largest number of elements of any tensor an aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                self.largest = max(self.largest, o.numel())
        return out


def test_no_tensor_of_tokens_by_vocab_forward_or_backward() -> None:
    x, w, t = inputs(dtype=torch.float32)
    with _Sizes() as sizes:
        linear_softcap_cross_entropy(x, w, t, 15.0, chunk=8).backward()
    # One chunk's logits, the weight and its gradient, the input and its gradient: never N x V.
    assert sizes.largest <= max(8 * V, V * C, N * C) < N * V
    with _Sizes() as sizes:
        plain(x, w, t, 15.0).backward()
    assert sizes.largest >= N * V  # what the plain form allocates (the check can fail)


def test_chunk_rows_follow_the_vocabulary() -> None:
    assert chunk_rows(8192) * 8192 * 4 <= 16 * 2**20
    assert chunk_rows(10**12) == 1


def test_model_loss_trains_through_the_fused_op_and_a_kernel_slot_still_gets_logits() -> None:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=V, sequence_len=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=C)
    model = GPT(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 1.0)  # bent by the softcap
    idx, targets = torch.randint(0, V, (3, 16)), torch.randint(0, V, (3, 16))
    expected = F.cross_entropy(model(idx).view(-1, V), targets.view(-1))
    expected.backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    loss = model.loss(idx, targets)
    loss.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    for p, ref in zip(model.parameters(), ref_grads, strict=True):
        torch.testing.assert_close(p.grad, ref, rtol=1e-4, atol=1e-6)

    seen: list[tuple[int, ...]] = []

    def kernel(logits, targets, cap, ignore_index=-1, reduction="mean"):
        seen.append(tuple(logits.shape))
        return ops.reference("softcapped_cross_entropy")(logits, targets, cap, ignore_index, reduction)

    ops.register("softcapped_cross_entropy", kernel)
    try:
        torch.testing.assert_close(model.loss(idx, targets), expected, rtol=1e-5, atol=1e-6)
    finally:
        ops.reset("softcapped_cross_entropy")
    assert seen == [(3, 16, V)]  # the logits, shaped as model.forward returns them
