"""Each kernel: its PyTorch reference against float64 math, and the kernel (run by the
NumPy interpreter, and by nki.simulate where nki is installed) against the reference,
forward and backward, on fresh random inputs of several shapes including ragged edges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.testing import bf16, round_bf16
from trnfrontier.runtime import muon, ops
from trnfrontier.runtime.kernels import references


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


TOL = {"float32": dict(rtol=2e-5, atol=2e-5), "bfloat16": dict(rtol=3e-2, atol=3e-2)}
DTYPES = ["float32", "bfloat16"]


def _host(a: np.ndarray, dtype: str):
    return bf16(a) if dtype == "bfloat16" else a


def _torch(a: np.ndarray, dtype: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(torch.bfloat16) if dtype == "bfloat16" else t


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy()


def _inputs(a: np.ndarray, dtype: str) -> np.ndarray:
    """The values a kernel of this dtype actually sees."""
    return round_bf16(a) if dtype == "bfloat16" else a


# ---------------------------------------------------------------- relu2


def test_relu2_reference_vs_float64() -> None:
    x = torch.randn(33, 17, dtype=torch.float64)
    xd = x.numpy()
    np.testing.assert_allclose(
        references.relu2(x.float()).numpy(), np.maximum(xd, 0) ** 2, rtol=1e-6
    )
    dy = torch.randn_like(x)
    np.testing.assert_allclose(
        references.relu2_backward(x.float(), dy.float()).numpy(),
        2 * np.maximum(xd, 0) * dy.numpy(),
        rtol=1e-6,
    )
    torch.testing.assert_close(references.relu2(x), ops.reference("relu_squared")(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 5), (128, 64), (300, 2100)])
def test_relu2_kernel_vs_reference(kernel, dtype: str, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(hash((shape, dtype)) % 2**32)
    x, dy = _inputs(rand(rng, *shape), dtype), _inputs(rand(rng, *shape), dtype)
    k = kernel("relu2")
    np.testing.assert_allclose(
        k.relu2_fwd(_host(x, dtype)), _np(references.relu2(_torch(x, dtype))), **TOL[dtype]
    )
    np.testing.assert_allclose(
        k.relu2_bwd(_host(x, dtype), _host(dy, dtype)),
        _np(references.relu2_backward(_torch(x, dtype), _torch(dy, dtype))),
        **TOL[dtype],
    )


# ---------------------------------------------------------------- rmsnorm


def _rms64(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps)


def test_rmsnorm_reference_vs_float64_and_model() -> None:
    x = torch.randn(20, 48, dtype=torch.float64)
    y, rstd = references.rmsnorm(x.float(), 1e-6)
    np.testing.assert_allclose(y.numpy(), _rms64(x.numpy(), 1e-6), rtol=1e-5, atol=1e-6)
    # the backward formula against float64 autograd
    x.requires_grad_(True)
    dy = torch.randn_like(x)
    (gx,) = torch.autograd.grad(references.rmsnorm(x, 1e-6)[0], x, dy)
    np.testing.assert_allclose(
        references.rmsnorm_backward(x.detach().float(), dy.float(), rstd).numpy(),
        gx.numpy(),
        rtol=1e-4,
        atol=1e-5,
    )
    eps = references.default_eps(torch.float32)
    torch.testing.assert_close(
        references.rmsnorm(x.detach().float(), eps)[0],
        ops.reference("rms_norm")(x.detach().float()),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 32), (128, 96), (257, 640)])
def test_rmsnorm_kernel_vs_reference(kernel, dtype: str, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(hash((shape, dtype)) % 2**32)
    x, dy = _inputs(rand(rng, *shape, scale=3.0), dtype), _inputs(rand(rng, *shape), dtype)
    k = kernel("rmsnorm")
    y, rstd = k.rmsnorm_fwd(_host(x, dtype), 1e-6)
    y_ref, rstd_ref = references.rmsnorm(_torch(x, dtype), 1e-6)
    np.testing.assert_allclose(y, _np(y_ref), **TOL[dtype])
    np.testing.assert_allclose(rstd, _np(rstd_ref), rtol=1e-5)
    dx = k.rmsnorm_bwd(_host(x, dtype), _host(dy, dtype), rstd)
    np.testing.assert_allclose(
        dx,
        _np(references.rmsnorm_backward(_torch(x, dtype), _torch(dy, dtype), rstd_ref)),
        **TOL[dtype],
    )


# ---------------------------------------------------------------- rope + qk-norm


def _angles(rng: np.random.Generator, t: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    ang = (rng.random((t, half)) * 6.3).astype(np.float32)
    return np.cos(ang), np.sin(ang)


def test_rope_qknorm_reference_vs_float64_and_model() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 9, 16))
    cos, sin = _angles(rng, 9, 8)
    x1, x2 = x[..., :8], x[..., 8:]
    z = np.concatenate([x1 * cos + x2 * sin, x2 * cos - x1 * sin], -1)
    y, _ = references.rope_qknorm(
        torch.tensor(x, dtype=torch.float32), torch.tensor(cos), torch.tensor(sin), 1e-6, True
    )
    np.testing.assert_allclose(y.numpy(), _rms64(z, 1e-6), rtol=1e-5, atol=1e-5)
    model = ops.reference("apply_rotary")(
        torch.tensor(x, dtype=torch.float32),
        torch.tensor(cos)[None, None],
        torch.tensor(sin)[None, None],
    )
    torch.testing.assert_close(
        references.rope_qknorm(
            torch.tensor(x, dtype=torch.float32), torch.tensor(cos), torch.tensor(sin), 0.0, False
        )[0],
        model,
    )
    # backward formula against float64 autograd
    xt = torch.tensor(x, requires_grad=True)
    c64, s64 = torch.tensor(cos, dtype=torch.float64), torch.tensor(sin, dtype=torch.float64)
    dy = torch.randn_like(xt)
    for normalize in (True, False):
        out, rstd = references.rope_qknorm(xt, c64, s64, 1e-6, normalize)
        (gx,) = torch.autograd.grad(out, xt, dy)
        torch.testing.assert_close(
            references.rope_qknorm_backward(xt.detach(), dy, c64, s64, rstd, normalize), gx
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(
    "shape", [(1, 1, 5, 8), (2, 3, 130, 32), (1, 2, 128, 128), (1, 2, 300, 16)]
)  # the last: a group of two positions per partition, then a ragged tail
def test_rope_qknorm_kernel_vs_reference(
    kernel, dtype: str, normalize: bool, shape: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(hash((shape, dtype, normalize)) % 2**32)
    x, dy = _inputs(rand(rng, *shape), dtype), _inputs(rand(rng, *shape), dtype)
    cos, sin = _angles(rng, shape[2], shape[3] // 2)
    k = kernel("rope_qknorm")
    # the kernel's layout is [B, T, H, D] (the model's q/k in memory); the reference's [B, H, T, D]
    x_t, dy_t = (np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in (x, dy))
    y, rstd = k.rope_qknorm_fwd(_host(x_t, dtype), cos, sin, 1e-6, normalize)
    y_ref, rstd_ref = references.rope_qknorm(
        _torch(x, dtype), torch.tensor(cos), torch.tensor(sin), 1e-6, normalize
    )
    np.testing.assert_allclose(y.transpose(0, 2, 1, 3), _np(y_ref), **TOL[dtype])
    # the kernel's rstd is [B, T, H] (one store per tile), the reference's [B, H, T, 1]
    np.testing.assert_allclose(
        rstd, _np(rstd_ref)[..., 0].transpose(0, 2, 1), rtol=1e-5, atol=1e-6
    )
    dx = k.rope_qknorm_bwd(_host(x_t, dtype), _host(dy_t, dtype), cos, sin, rstd, normalize)
    dx = dx.transpose(0, 2, 1, 3)
    dx_ref = references.rope_qknorm_backward(
        _torch(x, dtype),
        _torch(dy, dtype),
        torch.tensor(cos),
        torch.tensor(sin),
        rstd_ref,
        normalize,
    )
    np.testing.assert_allclose(dx, _np(dx_ref), **TOL[dtype])


# ---------------------------------------------------------------- cross-entropy


def _targets(rng: np.random.Generator, n: int, v: int) -> np.ndarray:
    t = rng.integers(0, v, size=n)
    t[rng.random(n) < 0.1] = -1  # ignored positions
    return t


def test_cross_entropy_reference_vs_float64_and_model() -> None:
    rng = np.random.default_rng(2)
    z = rng.standard_normal((40, 300)) * 8
    t = _targets(rng, 40, 300)
    for cap in (15.0, 0.0):
        s = cap * np.tanh(z / cap) if cap else z
        lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
        want = np.where(t >= 0, lse - s[np.arange(40), np.maximum(t, 0)], 0.0)
        loss, _ = references.cross_entropy(
            torch.tensor(z, dtype=torch.float32), torch.tensor(t), cap
        )
        np.testing.assert_allclose(loss.numpy(), want, rtol=1e-5, atol=1e-5)
        zt = torch.tensor(z, requires_grad=True)
        l64, lse64 = references.cross_entropy(zt, torch.tensor(t), cap)
        dl = torch.randn(40, dtype=torch.float64)
        (gz,) = torch.autograd.grad(l64, zt, dl)
        torch.testing.assert_close(
            references.cross_entropy_backward(zt.detach(), torch.tensor(t), lse64, dl, cap), gz
        )
    zt, tt = torch.tensor(z, dtype=torch.float32), torch.tensor(t)
    model = ops.reference("cross_entropy")(ops.reference("softcap")(zt, 15.0), tt, ignore_index=-1)
    loss, _ = references.cross_entropy(zt, tt, 15.0)
    torch.testing.assert_close(loss.sum() / (tt >= 0).sum(), model)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cap", [15.0, 0.0])
@pytest.mark.parametrize("shape", [(5, 100), (300, 2100)])
def test_cross_entropy_kernel_vs_reference(
    kernel, dtype: str, cap: float, shape: tuple[int, int]
) -> None:
    rng = np.random.default_rng(hash((shape, dtype, cap)) % 2**32)
    z = _inputs(rand(rng, *shape, scale=6.0), dtype)
    t = _targets(rng, *shape)
    tf = t.astype(np.float32)[:, None]
    k = kernel("cross_entropy")
    loss, lse = k.cross_entropy_fwd(_host(z, dtype), tf, cap)
    loss_ref, lse_ref = references.cross_entropy(_torch(z, dtype), torch.tensor(t), cap)
    np.testing.assert_allclose(
        loss[:, 0], _np(loss_ref), rtol=1e-5, atol=2e-5
    )  # float32 math either way
    dl = rand(rng, shape[0], 1)
    dz = k.cross_entropy_bwd(_host(z, dtype), tf, lse, dl, cap)
    dz_ref = references.cross_entropy_backward(
        _torch(z, dtype), torch.tensor(t), lse_ref, torch.tensor(dl[:, 0]), cap
    )
    np.testing.assert_allclose(dz, _np(dz_ref), **TOL[dtype])


def test_softcapped_forward_is_one_pass_without_a_running_max(
    interpreted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a softcap, cap bounds the logits: a fixed shift, no max and no rescaling."""
    from kernels.testing import isa

    calls: list[str] = []
    for name in ("tensor_reduce", "activation", "activation_reduce"):
        real = getattr(isa, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(f"{_name}:{kwargs.get('op')!r}")
            return _real(*args, **kwargs)

        monkeypatch.setattr(isa, name, spy)
    rng = np.random.default_rng(4)
    z, t = rand(rng, 20, 4200), rng.integers(0, 4200, (20, 1)).astype(np.float32)
    for cap, running_max in ((15.0, False), (0.0, True)):
        calls.clear()
        interpreted("cross_entropy").cross_entropy_fwd(z, t, cap)
        assert ("tensor_reduce:nl.maximum" in calls) is running_max
        assert calls.count("activation_reduce:nl.exp") == 3  # one per vocabulary chunk


# ---------------------------------------------------------------- attention


def _attention64(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    rep = q.shape[1] // k.shape[1]
    k, v = (
        np.repeat(k, rep, axis=1).astype(np.float64),
        np.repeat(v, rep, axis=1).astype(np.float64),
    )
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * scale
    t = q.shape[2]
    s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


ATTN_SHAPES = [
    ((1, 1, 5, 8), 1),
    ((1, 4, 200, 32), 2),
    ((2, 2, 256, 64), 2),
    ((1, 2, 130, 128), 1),
    ((1, 2, 600, 16), 1),  # two 512-key chunks, the second ragged
]


def test_attention_reference_vs_float64_and_model() -> None:
    rng = np.random.default_rng(3)
    q, k, v = (
        rng.standard_normal((1, 4, 37, 16)),
        rng.standard_normal((1, 2, 37, 16)),
        rng.standard_normal((1, 2, 37, 16)),
    )
    got = references.attention(*(torch.tensor(a, dtype=torch.float32) for a in (q, k, v)), 0.25)
    np.testing.assert_allclose(got.numpy(), _attention64(q, k, v, 0.25), rtol=1e-4, atol=1e-5)
    qt, kt, vt = (torch.tensor(a, dtype=torch.float32) for a in (q, k, v))
    torch.testing.assert_close(
        references.attention(qt, kt, vt, 16**-0.5), ops.reference("causal_attention")(qt, kt, vt)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "kv_heads"), ATTN_SHAPES)
def test_attention_kernel_vs_reference(
    kernel, dtype: str, shape: tuple[int, ...], kv_heads: int
) -> None:
    rng = np.random.default_rng(hash((shape, dtype)) % 2**32)
    b, h, t, d = shape
    q = _inputs(rand(rng, *shape), dtype)
    k, v = (
        _inputs(rand(rng, b, kv_heads, t, d), dtype),
        _inputs(rand(rng, b, kv_heads, t, d), dtype),
    )
    scale = d**-0.5
    o, lse = kernel("attention").attention_fwd(
        _host(q, dtype), _host(k, dtype), _host(v, dtype), scale
    )
    ref = references.attention(_torch(q, dtype), _torch(k, dtype), _torch(v, dtype), scale)
    np.testing.assert_allclose(o, _np(ref), **TOL[dtype])
    if dtype == "float32":
        np.testing.assert_allclose(o, _attention64(q, k, v, scale), rtol=1e-4, atol=1e-4)
        # lse of the causal, scaled scores (what a backward kernel would consume)
        rep = h // kv_heads
        s = (
            np.einsum(
                "bhqd,bhkd->bhqk", q.astype(np.float64), np.repeat(k, rep, 1).astype(np.float64)
            )
            * scale
        )
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
        want = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
        np.testing.assert_allclose(lse[..., 0], want, rtol=1e-4, atol=1e-4)
    # the backward kernel against autograd through the reference
    do = _inputs(rand(rng, *shape), dtype)
    grads = kernel("attention_bwd").attention_bwd(
        _host(q, dtype),
        _host(k, dtype),
        _host(v, dtype),
        _host(o, dtype),
        _host(do, dtype),
        lse,
        scale,
    )
    leaves = [_torch(a, dtype).float().requires_grad_(True) for a in (q, k, v)]
    out = references.attention(*leaves, scale)
    want_grads = torch.autograd.grad(out, leaves, _torch(do, dtype).float())
    for got, want in zip(grads, want_grads, strict=True):
        np.testing.assert_allclose(got, _np(want), **TOL[dtype])


# ---------------------------------------------------------------- polar express


def _polar64(g: np.ndarray, coeffs, eps: float) -> np.ndarray:
    x = g.astype(np.float64)
    x = x / (np.linalg.norm(x) + eps)
    for a, b, c in coeffs:
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x


def test_polar_express_reference_vs_float64_and_muon() -> None:
    g = torch.randn(24, 40)
    coeffs = muon.POLAR_EXPRESS_COEFFS
    np.testing.assert_allclose(
        references.polar_express(g, coeffs, 1e-7).numpy(),
        _polar64(g.numpy(), coeffs, 1e-7),
        rtol=1e-4,
        atol=1e-5,
    )
    # The reference is Muon's float32 path (Muon's default on a CPU with bfloat16 matmuls is bfloat16).
    torch.testing.assert_close(references.polar_express(g, coeffs, 1e-7), muon.polar_express(g, dtype=torch.float32))
    torch.testing.assert_close(
        references.polar_express(g.T.contiguous(), coeffs, 1e-7),
        muon.polar_express(g.T.contiguous(), dtype=torch.float32),
    )


@pytest.mark.parametrize(("shape", "steps"), [((3, 8, 16), 5), ((1, 130, 300), 2)])
def test_polar_express_kernel_vs_reference(kernel, shape: tuple[int, int, int], steps: int) -> None:
    rng = np.random.default_rng(hash(shape) % 2**32)
    g = rand(rng, *shape)
    coeffs = muon.POLAR_EXPRESS_COEFFS[:steps]
    out = kernel("polar_express").polar_express_fwd(g, coeffs, 1e-7)
    want = np.stack([references.polar_express(torch.tensor(m), coeffs, 1e-7).numpy() for m in g])
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-5)


def test_polar_express_kernel_bf16_is_close_to_float64(kernel) -> None:
    g = rand(np.random.default_rng(5), 1, 16, 48)
    out = kernel("polar_express").polar_express_fwd(bf16(g), muon.POLAR_EXPRESS_COEFFS, 1e-7)
    want = _polar64(round_bf16(g[0]), muon.POLAR_EXPRESS_COEFFS, 1e-7)
    assert np.abs(out[0] - want).max() < 0.05 * np.abs(want).max()


def test_polar_express_zero_gradient_step(kernel) -> None:
    """Muon's first step for a zero-initialised output projection: G == 0 exactly.
    ||G||_F = 0 must not reach sqrt (outside its valid range: NaN); the result is 0."""
    g = rand(np.random.default_rng(9), 2, 8, 16)
    g[1] = 0.0
    out = kernel("polar_express").polar_express_fwd(bf16(g), muon.POLAR_EXPRESS_COEFFS, 1e-7)
    assert np.isfinite(out).all()
    assert (out[1] == 0).all()
    want = references.polar_express(torch.zeros(8, 16), muon.POLAR_EXPRESS_COEFFS, 1e-7)
    assert (want == 0).all()


def test_polar_express_sbuf_formula_matches_runtime(interpreted) -> None:
    from trnfrontier.runtime.kernels import backend

    k = interpreted("polar_express")
    for m, n, item in [(640, 2560, 2), (640, 2560, 4), (130, 300, 4)]:
        assert k.sbuf_bytes(m, n, item) == backend.polar_express_sbuf_bytes(m, n, item)
    assert backend.supports_polar_express((640, 2560), torch.bfloat16, 2) is None
    assert "SBUF" in backend.supports_polar_express((640, 2560), torch.float32, 4)


def test_runtime_sbuf_figure_is_the_interpreters_target() -> None:
    from kernels.testing import machine
    from trnfrontier.runtime.kernels import backend

    assert backend.SBUF_BYTES_PER_PARTITION == machine.TRN2.sbuf_bytes_per_partition
