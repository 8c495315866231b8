"""Polar Express and the Muon optimizer."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from trnfrontier.runtime import muon
from trnfrontier.runtime.muon import POLAR_EXPRESS_COEFFS, Muon, polar_express, set_hyperparams

torch.set_num_threads(1)

# The band the five iterations map every normalised singular value in [1e-3, 1] into.
# Derived, not guessed: see test_scalar_polynomial_band (the composite quintic on a fine
# grid has min 0.8586 and max 1.1411 there). Matrices whose normalised singular values lie
# in that range must therefore come out with singular values inside it.
BAND = (0.85, 1.15)


def composite(x: np.ndarray, steps: int = 5) -> np.ndarray:
    for a, b, c in POLAR_EXPRESS_COEFFS[:steps]:
        x = a * x + b * x**3 + c * x**5
    return x


def test_scalar_polynomial_band() -> None:
    x = np.linspace(1e-3, 1.0, 200_001)
    y = composite(x)
    assert BAND[0] <= y.min() and y.max() <= BAND[1]
    # And the band is tight: not a loose bound that would hide a wrong coefficient.
    assert y.min() < 0.87 and y.max() > 1.13


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(32, 128), (128, 32), (48, 96), (16, 512)])
def test_polar_express_singular_values_near_one_for_random_rectangular(
    shape: tuple[int, int], dtype: torch.dtype,
) -> None:
    torch.manual_seed(0)
    G = torch.randn(*shape)
    out = polar_express(G, dtype=dtype)
    assert out.shape == G.shape and out.dtype == G.dtype
    s = torch.linalg.svdvals(out)
    assert BAND[0] <= s.min().item() and s.max().item() <= BAND[1], (s.min(), s.max())


@pytest.mark.parametrize(("dtype", "off_diagonal"), [(torch.float32, 1e-4), (torch.bfloat16, 6e-2)])
def test_polar_express_on_prescribed_spectrum_keeps_singular_vectors(dtype: torch.dtype, off_diagonal: float) -> None:
    """G = U diag(s) V^T with a condition number of 300: the output is U diag(s') V^T
    with every s' in the band, i.e. close to the polar factor U V^T. bfloat16 rounds each
    of the 15 products to 8 bits (2^-8 relative), which mixes the closely spaced small
    singular directions: 0.041 here, against 1e-5 in float32; a wrong transpose gives O(1)."""
    torch.manual_seed(1)
    U, _ = torch.linalg.qr(torch.randn(64, 64, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(96, 64, dtype=torch.float64))
    s = torch.logspace(0, -2.5, 64, dtype=torch.float64)
    # Normalised by the Frobenius norm, the smallest is ~3e-3/||s|| > 1e-3: inside the band.
    assert (s.min() / s.norm()).item() > 1e-3
    G = (U * s) @ V.T
    out = polar_express(G, dtype=dtype).double()
    s_out = torch.linalg.svdvals(out)
    assert BAND[0] <= s_out.min().item() and s_out.max().item() <= BAND[1]
    # Same singular vectors: U^T out V is diagonal.
    inner = U.T @ out @ V
    off_diag = inner - torch.diag(torch.diagonal(inner))
    assert off_diag.abs().max().item() < off_diagonal


def test_polar_express_batched_equals_one_by_one_and_is_scale_invariant() -> None:
    torch.manual_seed(2)
    G = torch.randn(3, 24, 40)
    batched = polar_express(G, dtype=torch.float32)
    for i in range(3):
        torch.testing.assert_close(batched[i], polar_express(G[i], dtype=torch.float32), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(polar_express(G[0] * 1e3, dtype=torch.float32), batched[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_polar_express_gives_each_matrix_the_same_bits_in_any_batch(dtype: torch.dtype) -> None:
    """The sharded optimizer orthogonalises a rank's share of a bucket: each matrix must
    come out bit for bit as in the whole bucket (tall, wide and square)."""
    torch.manual_seed(5)
    for shape in ((7, 48, 16), (5, 16, 48), (6, 32, 32)):
        G = torch.randn(*shape)
        whole = polar_express(G, dtype=dtype)
        for start, stop in ((0, 1), (1, 3), (3, shape[0])):
            assert torch.equal(polar_express(G[start:stop].clone(), dtype=dtype), whole[start:stop])


def test_polar_express_computes_in_bfloat16_only_where_the_cpu_multiplies_it() -> None:
    """On a CPU the default is CPU_POLAR_DTYPE: bfloat16 with AVX512-BF16 or AMX (twice
    as fast there), float32 elsewhere (bfloat16 would be emulated); accelerators bfloat16."""
    native = bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    if os.environ.get(muon.POLAR_ENV, "").strip().lower() != "float32":
        assert muon.CPU_POLAR_DTYPE == (torch.bfloat16 if native else torch.float32)
    assert muon.polar_dtype(torch.device("cuda")) == torch.bfloat16
    G = torch.randn(24, 40)
    out = polar_express(G)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, polar_express(G, dtype=muon.CPU_POLAR_DTYPE), atol=0, rtol=0)
    if muon.CPU_POLAR_DTYPE == torch.bfloat16:
        assert not torch.equal(out, polar_express(G, dtype=torch.float32))


@pytest.mark.parametrize(("value", "forced"), [("float32", True), ("", False), ("bfloat16", False)])
def test_trnf_cpu_polar_float32_keeps_every_cpu_in_float32(value: str, forced: bool) -> None:
    code = "from trnfrontier.runtime import muon; print(muon.CPU_POLAR_DTYPE)"
    env = {**os.environ, muon.POLAR_ENV: value}
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()
    native = bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    assert shown == ("torch.bfloat16" if native and not forced else "torch.float32")


def test_polar_express_fewer_steps_and_bad_input() -> None:
    G = torch.randn(16, 32)
    assert polar_express(G, steps=1).shape == G.shape
    with pytest.raises(ValueError):
        polar_express(G, steps=6)
    with pytest.raises(ValueError):
        polar_express(torch.randn(8))


# ---------------------------------------------------------------- the optimizer


def quadratic_problem(seed: int = 0) -> tuple[torch.nn.Parameter, torch.Tensor]:
    torch.manual_seed(seed)
    W = torch.nn.Parameter(torch.zeros(16, 32))
    target = torch.randn(16, 32) * 0.1
    return W, target


def run_muon(steps: int = 40, **kwargs) -> tuple[list[float], torch.nn.Parameter, Muon]:
    W, target = quadratic_problem()
    opt = Muon([W], lr=kwargs.pop("lr", 0.02), **kwargs)
    losses = []
    for _ in range(steps):
        loss = (W - target).square().sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, W, opt


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"nesterov": False},
        {"normuon": True},
        {"weight_decay": 0.1, "cautious_wd": True},
        {"weight_decay": 0.1},
    ],
)
def test_muon_reduces_loss(kwargs: dict) -> None:
    losses, W, _ = run_muon(**kwargs)
    assert losses[-1] < 0.2 * losses[0]
    assert torch.isfinite(W).all()


def test_muon_first_step_is_lr_times_scale_times_orthogonal_update() -> None:
    """With zero momentum the update is exactly lr * max(1, rows/cols)^0.5 * polar(G)."""
    torch.manual_seed(3)
    for shape in [(64, 16), (16, 64)]:
        W = torch.nn.Parameter(torch.randn(*shape))
        before = W.detach().clone()
        W.grad = torch.randn(*shape)
        opt = Muon([W], lr=0.1, momentum=0.0)
        opt.step()
        scale = max(1.0, shape[0] / shape[1]) ** 0.5
        torch.testing.assert_close(
            before - W.detach(), 0.1 * scale * polar_express(W.grad), atol=1e-6, rtol=1e-5
        )


def test_muon_weight_decay_is_decoupled_and_scaled_by_lr() -> None:
    W = torch.nn.Parameter(torch.ones(8, 8))
    W.grad = torch.zeros(8, 8)  # polar(0) = 0: only the decay acts
    opt = Muon([W], lr=0.1, momentum=0.0, weight_decay=0.5)
    opt.step()
    torch.testing.assert_close(W.detach(), torch.full((8, 8), 1.0 - 0.1 * 0.5))


def test_cautious_weight_decay_only_where_update_and_weight_agree_in_sign() -> None:
    torch.manual_seed(4)
    W = torch.nn.Parameter(torch.randn(8, 16))
    W.grad = torch.randn(8, 16)
    before = W.detach().clone()
    update = polar_express(W.grad)
    lr, wd = 0.01, 0.5
    opt = Muon([W], lr=lr, momentum=0.0, weight_decay=wd, cautious_wd=True)
    opt.step()
    agree = torch.sign(update) == torch.sign(before)
    assert agree.any() and (~agree).any()
    expected = before - lr * wd * before * agree - lr * update
    torch.testing.assert_close(W.detach(), expected, atol=1e-6, rtol=1e-5)


def test_normuon_equalises_row_norms_and_keeps_update_norm() -> None:
    torch.manual_seed(5)
    rows, cols = 16, 64
    W = torch.nn.Parameter(torch.zeros(rows, cols))
    # A gradient whose polar factor has very unequal row norms: rows beyond the rank get
    # nothing, and the rest differ in scale after the imperfect iteration.
    G = torch.randn(rows, cols) * torch.linspace(0.1, 3.0, rows)[:, None]
    W.grad = G.clone()
    plain = polar_express(G)
    opt = Muon([W], lr=1.0, momentum=0.0, normuon=True, beta2=0.0)
    opt.step()
    update = -W.detach()
    torch.testing.assert_close(update.norm(), plain.norm(), atol=1e-4, rtol=1e-4)
    # beta2 = 0: v is this step's per-row mean square, so every row ends with the same norm.
    row_norms = update.norm(dim=1)
    assert (row_norms.max() / row_norms.min()).item() < 1.001
    assert "second_moment" in opt.state[W] and opt.state[W]["second_moment"].shape == (rows, 1)


def test_hyperparams_are_per_group_tensors_updated_in_place() -> None:
    a = torch.nn.Parameter(torch.zeros(4, 4))
    b = torch.nn.Parameter(torch.zeros(4, 8))
    opt = Muon([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.02, momentum=0.9)
    lr0, mom0 = opt.param_groups[0]["lr"], opt.param_groups[0]["momentum"]
    assert isinstance(lr0, torch.Tensor) and lr0.dim() == 0 and lr0.dtype == torch.float32
    assert opt.param_groups[0]["lr"] is not opt.param_groups[1]["lr"]  # never shared
    set_hyperparams(opt, lr=0.1, momentum=0.85, weight_decay=0.01)
    assert opt.param_groups[0]["lr"] is lr0 and opt.param_groups[0]["momentum"] is mom0
    assert lr0.item() == pytest.approx(0.1) and mom0.item() == pytest.approx(0.85)
    assert opt.param_groups[1]["lr"].item() == pytest.approx(0.1)
    with pytest.raises(KeyError, match="bogus"):
        set_hyperparams(opt, bogus=1.0)


def test_state_dict_round_trip_keeps_hyperparameter_tensor_objects() -> None:
    losses, W, opt = run_muon(steps=3, normuon=True)
    set_hyperparams(opt, lr=0.123)
    saved = opt.state_dict()
    W2, _ = quadratic_problem()
    fresh = Muon([W2], lr=0.5, normuon=True)
    lr_tensor = fresh.param_groups[0]["lr"]
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] is lr_tensor
    assert lr_tensor.item() == pytest.approx(0.123)
    torch.testing.assert_close(fresh.state[W2]["momentum_buffer"], opt.state[W]["momentum_buffer"])


def test_muon_calls_the_module_global_polar_express(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels layer swaps ``muon.polar_express``; Muon must pick the swap up, and
    orthogonalise same-shaped matrices in one batched call."""
    import trnfrontier.runtime.muon as muon_module

    calls = []

    def spy(G: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
        calls.append(tuple(G.shape))
        return polar_express(G, steps, eps)

    monkeypatch.setattr(muon_module, "polar_express", spy)
    params = [torch.nn.Parameter(torch.randn(8, 16)) for _ in range(3)] + [
        torch.nn.Parameter(torch.randn(16, 8))
    ]
    for p in params:
        p.grad = torch.randn_like(p)
    Muon(params, lr=0.01).step()
    assert sorted(calls) == [(1, 16, 8), (3, 8, 16)]


def test_muon_rejects_vectors() -> None:
    with pytest.raises(ValueError, match="matrices"):
        Muon([torch.nn.Parameter(torch.zeros(4))])


def test_muon_step_runs_under_torch_compile_without_retracing_when_lr_changes() -> None:
    testing = pytest.importorskip("torch._dynamo.testing")
    W, target = quadratic_problem()
    opt = Muon([W], lr=0.02, normuon=True)
    counter = testing.CompileCounter()  # counts graphs captured, compiles nothing
    step = torch.compile(opt.step, backend=counter)
    for i in range(5):
        loss = (W - target).square().sum()
        loss.backward()
        set_hyperparams(opt, lr=0.02 * (1 - i / 4), momentum=0.85 + 0.02 * i)
        step()
        opt.zero_grad(set_to_none=False)
    # One capture for the whole run: new LR / momentum values are tensor contents, not
    # guards, and the optimizer state exists before the first step.
    assert counter.frame_count == 1
