"""The trnf:: custom ops: opcheck and gradcheck on the CPU implementations, the NKI path
(run through the interpreter on the CPU) against the reference path, fallbacks, and the
recipe-driven selection."""

from __future__ import annotations

import warnings

import pytest
import torch

from trnfrontier.runtime import muon, ops
from trnfrontier.runtime.kernels import (
    KernelFallbackWarning,
    KernelUnavailableError,
    backend,
    custom_ops,
    register_ops,
    reset_kernels,
    use_kernels,
)


def _angles(
    t: int, half: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    ang = torch.rand(t, half, dtype=torch.float64) * 6.3
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _opcheck_cases(dtype: torch.dtype) -> list[tuple[object, tuple]]:
    g = dict(dtype=dtype, requires_grad=True)
    cos, sin = _angles(6, 4, dtype)
    targets = torch.tensor([1, -1, 4, 0, 2, 3])
    return [
        (torch.ops.trnf.relu2.default, (torch.randn(3, 5, **g),)),
        (torch.ops.trnf.rmsnorm.default, (torch.randn(3, 8, **g), 1e-6)),
        (torch.ops.trnf.rope_qknorm.default, (torch.randn(1, 2, 6, 8, **g), cos, sin, 1e-6, True)),
        (torch.ops.trnf.rope_qknorm.default, (torch.randn(1, 2, 6, 8, **g), cos, sin, 0.0, False)),
        (torch.ops.trnf.cross_entropy.default, (torch.randn(6, 7, **g), targets, 15.0)),
        (
            torch.ops.trnf.attention.default,
            (
                torch.randn(1, 2, 5, 4, **g),
                torch.randn(1, 1, 5, 4, **g),
                torch.randn(1, 1, 5, 4, **g),
                0.5,
            ),
        ),
        (
            torch.ops.trnf.attention_backward.default,
            (
                torch.randn(1, 2, 5, 4, dtype=dtype),
                torch.randn(1, 1, 5, 4, dtype=dtype),
                torch.randn(1, 1, 5, 4, dtype=dtype),
                torch.randn(1, 2, 5, 4, dtype=dtype),
                torch.randn(1, 2, 5, 1, dtype=dtype),
                torch.randn(1, 2, 5, 4, dtype=dtype),
                0.5,
            ),
        ),
        (torch.ops.trnf.polar_express.default, (torch.randn(4, 6, dtype=dtype), 5, 1e-7)),
        (
            torch.ops.trnf.relu2_backward.default,
            (torch.randn(3, 5, dtype=dtype), torch.randn(3, 5, dtype=dtype)),
        ),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck(dtype: torch.dtype) -> None:
    for op, args in _opcheck_cases(dtype):
        torch.library.opcheck(op, args)


def test_gradcheck_float64() -> None:
    d = dict(dtype=torch.float64, requires_grad=True)
    cos, sin = _angles(5, 3, torch.float64)
    targets = torch.tensor([2, -1, 0, 4])
    checks = [
        (custom_ops.relu_squared, (torch.randn(4, 6, **d),)),
        (custom_ops.rms_norm, (torch.randn(4, 6, **d),)),
        (
            lambda x: custom_ops.rope_qknorm_op(x, cos, sin, 1e-6, True)[0],
            (torch.randn(1, 2, 5, 6, **d),),
        ),
        (
            lambda x: custom_ops.rope_qknorm_op(x, cos, sin, 0.0, False)[0],
            (torch.randn(1, 2, 5, 6, **d),),
        ),
        (
            lambda z: custom_ops.softcapped_cross_entropy(z, targets, 15.0, reduction="none"),
            (torch.randn(4, 9, **d) * 5,),
        ),
        (lambda z: custom_ops.cross_entropy(z, targets), (torch.randn(4, 9, **d),)),
        (
            lambda q, k, v: custom_ops.attention_op(q, k, v, 0.5)[0],
            (
                torch.randn(1, 2, 5, 4, **d),
                torch.randn(1, 1, 5, 4, **d),
                torch.randn(1, 1, 5, 4, **d),
            ),
        ),
    ]
    for fn, args in checks:
        assert torch.autograd.gradcheck(fn, args)


def test_ops_compatible_functions_match_the_model_references() -> None:
    x = torch.randn(2, 3, 10, 8)
    cos, sin = _angles(10, 4)
    c4, s4 = cos[None, None], sin[None, None]
    torch.testing.assert_close(custom_ops.relu_squared(x), ops.reference("relu_squared")(x))
    torch.testing.assert_close(custom_ops.rms_norm(x), ops.reference("rms_norm")(x))
    torch.testing.assert_close(
        custom_ops.apply_rotary(x, c4, s4), ops.reference("apply_rotary")(x, c4, s4)
    )
    torch.testing.assert_close(
        custom_ops.rotary_rms_norm(x, c4, s4),
        ops.reference("rms_norm")(ops.reference("apply_rotary")(x, c4, s4)),
    )
    k, v = torch.randn(2, 1, 10, 8), torch.randn(2, 1, 10, 8)
    torch.testing.assert_close(
        custom_ops.causal_attention(x, k, v), ops.reference("causal_attention")(x, k, v)
    )
    logits, t = torch.randn(2, 10, 50), torch.randint(0, 50, (2, 10))
    t[0, :3] = -1
    for reduction in ("mean", "sum", "none"):
        torch.testing.assert_close(
            custom_ops.cross_entropy(logits, t, reduction=reduction),
            ops.reference("cross_entropy")(logits, t, reduction=reduction),
        )
    g = torch.randn(3, 12, 20)
    torch.testing.assert_close(custom_ops.polar_express(g), muon.polar_express(g))


# ---------------------------------------------------------------- the NKI path, interpreted


def _grads(fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    out.float().square().sum().backward() if out.dim() else out.backward()
    return out.detach(), [t.grad for t in leaves if t.grad is not None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_path_matches_reference_path(interpreter_backend, dtype: torch.dtype) -> None:
    torch.manual_seed(0)  # fixed inputs: a tolerance test must not pass or fail by draw
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=4e-2, atol=4e-2)
    cos, sin = _angles(130, 16)
    c4, s4 = cos[None, None], sin[None, None]
    logits, t = torch.randn(2, 70, 600) * 4, torch.randint(0, 600, (2, 70))
    t[1, 5:9] = -1
    cases = [
        (custom_ops.relu_squared, (torch.randn(2, 70, 96, dtype=dtype),)),
        (custom_ops.rms_norm, (torch.randn(2, 70, 96, dtype=dtype),)),
        (lambda x: custom_ops.apply_rotary(x, c4, s4), (torch.randn(1, 2, 130, 32, dtype=dtype),)),
        (
            lambda x: custom_ops.rotary_rms_norm(x, c4, s4),
            (torch.randn(1, 2, 130, 32, dtype=dtype),),
        ),
        (
            custom_ops.causal_attention,
            (
                torch.randn(1, 4, 130, 32, dtype=dtype),
                torch.randn(1, 2, 130, 32, dtype=dtype),
                torch.randn(1, 2, 130, 32, dtype=dtype),
            ),
        ),
        (lambda z: custom_ops.softcapped_cross_entropy(z, t, 15.0), (logits,)),
        (lambda z: custom_ops.cross_entropy(z, t), (logits,)),
    ]
    for fn, inputs in cases:
        with backend.kernel_backend(backend.BACKEND.loader, set()):  # reference path
            want, want_grads = _grads(fn, *inputs)
        got, got_grads = _grads(fn, *inputs)
        torch.testing.assert_close(got.float(), want.float(), **tol)
        for a, b in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(a.float(), b.float(), **tol)
    g = torch.randn(2, 20, 12)
    torch.testing.assert_close(
        custom_ops.polar_express(g), muon.polar_express(g), rtol=0.05, atol=0.05
    )  # kernel path: bf16


def test_unsupported_shape_falls_back_once_with_a_warning(interpreter_backend) -> None:
    backend.set_mode("attention", "auto")
    q = torch.randn(1, 1, 8, 256)  # head dim 256 > 128
    with pytest.warns(
        KernelFallbackWarning,
        match=r"trnf::attention: \(1, 1, 8, 256\) float32.*head dim 256 > 128",
    ):
        out = custom_ops.causal_attention(q, q, q)
    torch.testing.assert_close(out, ops.reference("causal_attention")(q, q, q))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        custom_ops.causal_attention(q, q, q)  # said once per op and shape


def test_unsupported_shape_raises_when_the_recipe_demands_the_kernel(interpreter_backend) -> None:
    backend.set_mode("attention", "on")
    q = torch.randn(1, 1, 8, 256)
    with pytest.raises(
        KernelUnavailableError, match=r"kernels.attention: on.*\(1, 1, 8, 256\).*head dim 256 > 128"
    ):
        custom_ops.causal_attention(q, q, q)


# ---------------------------------------------------------------- selection


def test_use_kernels_off_neuron() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(use_kernels({}, "cpu").values()) == {"reference"}  # all off: nothing to say
    with pytest.warns(KernelFallbackWarning, match="relu2 \\(device cpu has no NKI\\); attention"):
        chosen = use_kernels({"relu2": "auto", "attention": "auto"}, "cpu")
    assert chosen["relu2"] == "reference" and ops.OPS["relu_squared"] is ops.reference(
        "relu_squared"
    )
    with pytest.raises(KernelUnavailableError, match="kernels.rmsnorm: on.*device cpu has no NKI"):
        use_kernels({"rmsnorm": "on"}, "cpu")
    with pytest.raises(ValueError, match="unknown kernel"):
        use_kernels({"flash": "on"}, "cpu")


def test_use_kernels_registers_and_reset_restores(interpreter_backend) -> None:
    plain_polar = muon.polar_express
    chosen = use_kernels({name: "on" for name in backend.KERNEL_NAMES}, "cpu")
    assert set(chosen.values()) == {"nki"}
    assert ops.OPS["relu_squared"] is custom_ops.relu_squared
    assert ops.OPS["causal_attention"] is custom_ops.causal_attention
    assert muon.polar_express is custom_ops.polar_express
    reset_kernels()
    assert ops.OPS == {name: ops.reference(name) for name in ops.OPS}
    assert muon.polar_express is plain_polar


def test_use_kernels_on_neuron_without_nki_says_what_is_missing() -> None:
    with backend.kernel_backend(backend.load_kernel_file, {"neuron"}):
        with pytest.raises(
            KernelUnavailableError, match="kernels.relu2: on.*No module named 'nki'"
        ):
            use_kernels({"relu2": "on"}, "neuron")
        with pytest.warns(KernelFallbackWarning, match="relu2 \\(ModuleNotFoundError"):
            assert use_kernels({"relu2": "auto"}, "neuron")["relu2"] == "reference"


def test_register_ops_routes_the_model_through_the_custom_ops() -> None:
    register_ops()
    for entry in (
        "relu_squared",
        "rms_norm",
        "apply_rotary",
        "rotary_rms_norm",
        "causal_attention",
        "cross_entropy",
        "softcapped_cross_entropy",
    ):
        assert ops.OPS[entry] is not ops.reference(entry)
    # the model's attention and loss reach the fused kernels, not the two-step compositions
    assert ops.OPS["rotary_rms_norm"] is custom_ops.rotary_rms_norm
    assert ops.OPS["softcapped_cross_entropy"] is custom_ops.softcapped_cross_entropy


def test_fused_defaults_compose_the_single_ops() -> None:
    """With kernels off, the fused entries are exactly the two-step plain computations."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 8)
    angles = torch.randn(5, 4)
    cos, sin = angles.cos()[None, None], angles.sin()[None, None]
    assert torch.equal(
        ops.rotary_rms_norm(x, cos, sin), ops.rms_norm(ops.apply_rotary(x, cos, sin))
    )
    logits, targets = torch.randn(2, 5, 11) * 30, torch.randint(0, 11, (2, 5))
    targets[0, 0] = -1
    fused = ops.softcapped_cross_entropy(logits, targets, 15.0, reduction="none")
    assert torch.equal(
        fused, ops.cross_entropy(ops.softcap(logits, 15.0), targets, reduction="none")
    )


def test_benchmark_kernels_reports_every_kernel_against_its_reference() -> None:
    from trnfrontier.runtime.kernels.bench import benchmark_kernels

    rows = benchmark_kernels("cpu", repeats=1)
    assert [r["name"] for r in rows] == [
        "relu2",
        "rmsnorm",
        "rope_qknorm",
        "cross_entropy",
        "attention",
        "polar_express",
    ]
    for row in rows:
        assert row["impl"] == "reference" and row["device"] == "cpu"
        assert row["kernel_ms"] > 0 and row["reference_ms"] > 0 and row["speedup"] > 0
        assert ("achieved_gbps" in row) != ("achieved_tflops" in row)
        assert row["peak_fraction"] is None  # no published peak for a CPU


@pytest.mark.parametrize("lnc", ["1", "2"])
def test_kernel_ops_inside_torch_compile(
    interpreter_backend, monkeypatch: pytest.MonkeyPatch, lnc: str
) -> None:
    """runtime.compile with kernels on: the ops trace into one graph (fullgraph, fixed
    shapes as the trainer compiles them, dynamic=False) through their fake and autograd
    registrations, and the compiled step runs the kernels, launched on the LNC grid."""
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", lnc)
    assert use_kernels({"relu2": "on", "rmsnorm": "on"}, "cpu") == {
        **{name: "reference" for name in backend.KERNEL_NAMES},
        "relu2": "nki",
        "rmsnorm": "nki",
    }
    calls: list[int] = []
    launcher = backend.BACKEND.launcher

    def counting(kernel: object, grid: tuple[int, ...]) -> object:
        calls.append(grid)
        return launcher(kernel, grid)

    monkeypatch.setattr(backend.BACKEND, "launcher", counting)

    def step(x: torch.Tensor) -> torch.Tensor:
        return custom_ops.rms_norm(custom_ops.relu_squared(x)).square().sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)
    x = torch.randn(3, 130, 16, requires_grad=True)
    loss = compiled(x)
    loss.backward()
    x_ref = x.detach().clone().requires_grad_(True)
    with backend.kernel_backend(backend.BACKEND.loader, set()):  # the reference path
        want = step(x_ref)
        want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    # forward and backward kernels, on the grid (a tuple), each wrapped once
    assert len(calls) == 4 and set(calls) == {(int(lnc),)}


def test_rope_kernel_reads_the_models_q_in_place(
    interpreter_backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's q is a [B, T, H, D] tensor viewed as [B, H, T, D]: the kernel takes the
    [B, T, H, D] memory as it is (no HBM copy) and the result has q's strides."""
    use_kernels({"rope_qknorm": "on"}, "cpu")
    base = torch.randn(2, 130, 3, 16)  # [B, T, H, D]
    q = base.transpose(1, 2)  # the model's [B, H, T, D] view
    seen: list[torch.Tensor] = []
    launcher = backend.BACKEND.launcher

    def spy(kernel: object, grid: tuple[int, ...]) -> object:
        run = launcher(kernel, grid)
        return lambda *args: (seen.append(args[0]), run(*args))[1]

    monkeypatch.setattr(backend.BACKEND, "launcher", spy)
    cos, sin = _angles(130, 8)
    y = custom_ops.rotary_rms_norm(q, cos[None, None], sin[None, None])
    assert seen[0].data_ptr() == base.data_ptr()  # the kernel read q's own memory
    assert y.stride() == q.stride()
    with backend.kernel_backend(backend.BACKEND.loader, set()):
        want = custom_ops.rotary_rms_norm(q, cos[None, None], sin[None, None])
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["relu_squared", "softcap"])
def test_reference_ops_without_autograd_give_the_same_bits_and_leave_the_input_alone(name: str) -> None:
    # Evaluation reuses buffers in place; the values must be those training computes.
    torch.manual_seed(0)
    x = torch.randn(64, 300) * 20
    before = x.clone()
    args = (15.0,) if name == "softcap" else ()
    with torch.enable_grad():
        trained = ops.reference(name)(x.clone().requires_grad_(), *args).detach()
    with torch.no_grad():
        evaluated = ops.reference(name)(x, *args)
    assert torch.equal(trained, evaluated)
    assert torch.equal(x, before)
