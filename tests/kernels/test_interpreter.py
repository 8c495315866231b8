"""The NumPy NKI interpreter: every supported call against a hand-computed result, and
every documented limit it enforces."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from kernels.testing import (
    NkiInterpreterError,
    NkiLimitError,
    UninitializedReadError,
    bf16,
    load_kernel_module,
    round_bf16,
)


def _kernel(tmp_path: Path, body: str, name: str = "k"):
    """Write a one-kernel file `def kern(...)` and load it under the interpreter."""
    src = (
        "import nki\nimport nki.language as nl\nimport nki.isa as nisa\n\n\n@nki.jit\n"
        + textwrap.dedent(body)
    )
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    return load_kernel_module(str(path)).kern


def _roundtrip_body(
    op_lines: str, out_shape: str = "x.shape", out_dtype: str = "nl.float32"
) -> str:
    return f"""
def kern(x, w):
    p, f = x.shape
    a = nl.ndarray((p, f), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=x)
    b = nl.ndarray(w.shape, dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=b, src=w)
    o = nl.ndarray({out_shape}, dtype={out_dtype}, buffer=nl.sbuf)
{textwrap.indent(textwrap.dedent(op_lines), "    ")}
    out = nl.ndarray({out_shape}, dtype={out_dtype}, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=o)
    return out
"""


_RETURN_COPY = """    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out
"""

X = np.array([[1.0, -2.0, 3.0], [-0.5, 0.25, 4.0]], dtype=np.float32)
W = np.array([[2.0], [-1.0]], dtype=np.float32)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("nisa.activation(dst=o, op=nl.relu, data=a)", np.maximum(X, 0)),
        ("nisa.activation(dst=o, op=nl.square, data=a, scale=2.0, bias=1.0)", (2 * X + 1) ** 2),
        ("nisa.activation(dst=o, op=nl.exp, data=a, bias=b)", np.exp(X + W)),
        ("nisa.activation(dst=o, op=nl.tanh, data=a, scale=b)", np.tanh(X * W)),
        ("nisa.activation(dst=o, op=nl.copy, data=a)", X),
        ("nisa.tensor_tensor(dst=o, data1=a, data2=a, op=nl.multiply)", X * X),
        ("nisa.tensor_tensor(dst=o, data1=a, data2=a, op=nl.subtract)", np.zeros_like(X)),
        (
            "nisa.tensor_scalar(dst=o, data=a, op0=nl.multiply, operand0=b, op1=nl.add, operand1=1.0)",
            X * W + 1,
        ),
        ("nisa.tensor_scalar(dst=o, data=a, op0=nl.subtract, operand0=1.0, reverse0=True)", 1 - X),
        (
            "nisa.tensor_scalar(dst=o, data=a, op0=nl.greater_equal, operand0=0.0)",
            (X >= 0).astype(np.float32),
        ),
        (
            "nisa.tensor_scalar(dst=o, data=a, op0=nl.equal, operand0=3.0)",
            (X == 3).astype(np.float32),
        ),
        ("nisa.tensor_copy(dst=o, src=a)", X),
        ("nisa.reciprocal(dst=o, data=a)", 1 / X),
        ("nisa.memset(dst=o, value=7.0)", np.full_like(X, 7)),
        (
            "nisa.affine_select(dst=o, pattern=[[-1, 3]], channel_multiplier=1, on_true_tile=a, on_false_value=-9.0,"
            " cmp_op=nl.greater_equal, offset=0)",
            np.where(np.arange(2)[:, None] >= np.arange(3)[None], X, -9),
        ),
        (
            "nisa.iota(dst=o, pattern=[[2, 3]], offset=5, channel_multiplier=10)",
            5 + 10 * np.arange(2)[:, None] + 2 * np.arange(3)[None].astype(np.float32),
        ),
    ],
)
def test_elementwise_calls_match_hand_computed(
    tmp_path: Path, lines: str, expected: np.ndarray
) -> None:
    kern = _kernel(tmp_path, _roundtrip_body(lines))
    np.testing.assert_allclose(kern(X, W), expected, rtol=1e-6)


POS = np.abs(X) + 0.5


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("nisa.activation(dst=o, op=nl.log, data=a)", np.log(POS)),
        ("nisa.activation(dst=o, op=nl.sqrt, data=a)", np.sqrt(POS)),
        ("nisa.activation(dst=o, op=nl.rsqrt, data=a)", 1 / np.sqrt(POS)),
        ("nisa.tensor_tensor(dst=o, data1=a, data2=a, op=nl.add)", 2 * POS),
        (
            "nisa.tensor_scalar(dst=o, data=a, op0=nl.maximum, operand0=1.0, op1=nl.minimum, operand1=3.0)",
            np.clip(POS, 1.0, 3.0),
        ),
        (
            "nisa.tensor_copy(dst=o[:, nl.ds(1, 2)], src=a[:, nl.ds(0, 2)])\n"
            "nisa.tensor_copy(dst=o[:, 0:1], src=a[:, 2:3])",
            POS[:, [2, 0, 1]],
        ),
    ],
)
def test_remaining_operators_and_ds(tmp_path: Path, lines: str, expected: np.ndarray) -> None:
    kern = _kernel(tmp_path, _roundtrip_body(lines))
    np.testing.assert_allclose(kern(POS, W), expected, rtol=1e-6)


def test_loop_ranges_run_every_iteration_in_order(tmp_path: Path) -> None:
    kern = _kernel(
        tmp_path,
        """
def kern(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    for i in nl.sequential_range(3):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    for j in nl.static_range(0, 4, 2):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.add, operand0=1.0)
    for k in nl.affine_range(x.shape[0]):
        nisa.tensor_scalar(dst=t[k : k + 1, :], data=t[k : k + 1, :], op0=nl.subtract, operand0=k)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
""",
    )
    np.testing.assert_allclose(kern(X), 8 * X + 2 - np.arange(2)[:, None])


def test_reductions(tmp_path: Path) -> None:
    body = _roundtrip_body(
        """
        s = nl.ndarray((p, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=o, op=nl.square, data=a, reduce_op=nl.add, reduce_res=s)
        nisa.tensor_reduce(dst=o[:, 0:1], op=nl.maximum, data=a, axis=1, keepdims=True)
        nisa.tensor_reduce(dst=o[:, 1:2], op=nl.add, data=a, axis=1, keepdims=True, negate=True)
        nisa.tensor_copy(dst=o[:, 2:3], src=s)
        """
    )
    got = _kernel(tmp_path, body)(X, W)
    np.testing.assert_allclose(got[:, 0], X.max(axis=1))
    np.testing.assert_allclose(got[:, 1], -X.sum(axis=1))
    np.testing.assert_allclose(got[:, 2], (X * X).sum(axis=1))


def test_matmul_transpose_and_accumulate(tmp_path: Path) -> None:
    kern = _kernel(
        tmp_path,
        """
def kern(s, m):
    k, mm = s.shape
    n = m.shape[1]
    st = nl.ndarray((k, mm), dtype=s.dtype, buffer=nl.sbuf)
    mv = nl.ndarray((k, n), dtype=m.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=s)
    nisa.dma_copy(dst=mv, src=m)
    acc = nl.ndarray((mm, n), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv)      # accumulates (auto)
    tp = nl.ndarray((mm, k), dtype=s.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=tp, data=st)
    o1 = nl.ndarray((mm, n), dtype=nl.float32, buffer=nl.sbuf)
    o2 = nl.ndarray((mm, k), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o1, src=acc)
    nisa.tensor_copy(dst=o2, src=tp)
    r1 = nl.ndarray((mm, n), dtype=nl.float32, buffer=nl.shared_hbm)
    r2 = nl.ndarray((mm, k), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=r1, src=o1)
    nisa.dma_copy(dst=r2, src=o2)
    return r1, r2
""",
    )
    rng = np.random.default_rng(0)
    s, m = (
        rng.standard_normal((5, 3)).astype(np.float32),
        rng.standard_normal((5, 4)).astype(np.float32),
    )
    r1, r2 = kern(s, m)
    np.testing.assert_allclose(r1, 2 * s.T @ m, rtol=1e-5)
    np.testing.assert_allclose(r2, s.T)


def test_bf16_rounding_and_storage(tmp_path: Path) -> None:
    assert (
        round_bf16(np.array([1.0 + 2**-9], np.float32))[0] == 1.0
    )  # below half an ulp: rounds down
    assert (
        round_bf16(np.array([1.0 + 3 * 2**-9], np.float32))[0] == 1.0 + 2**-7 * 1
    )  # ties/above go up
    kern = _kernel(
        tmp_path,
        """
def kern(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    o = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.activation(dst=o, op=nl.copy, data=t, scale=1.0 / 3.0)
    out = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=o)
    return out
""",
    )
    got = kern(bf16(np.ones((2, 2), np.float32)))
    np.testing.assert_array_equal(got, round_bf16(np.full((2, 2), 1 / 3, np.float32)))


# ---------------------------------------------------------------- limits and rules


def _alloc_kernel(tmp_path: Path, shape: str, buffer: str = "nl.sbuf", dtype: str = "nl.float32"):
    return _kernel(
        tmp_path,
        f"""
def kern(x):
    t = nl.ndarray({shape}, dtype={dtype}, buffer={buffer})
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out
""",
    )


def test_partition_dimension_over_128_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(NkiLimitError, match="partition dimension 129"):
        _alloc_kernel(tmp_path, "(129, 4)")(X)


def test_psum_tile_over_one_bank_is_rejected(tmp_path: Path) -> None:
    _alloc_kernel(tmp_path, "(128, 512)", "nl.psum")(X)
    with pytest.raises(NkiLimitError, match="bank"):
        _alloc_kernel(tmp_path, "(128, 513)", "nl.psum")(X)


def test_sbuf_capacity_per_partition(tmp_path: Path) -> None:
    _alloc_kernel(tmp_path, "(128, 212984 // 4)")(X)  # Trn2's usable 212,984 bytes: full
    with pytest.raises(NkiLimitError, match="212988 bytes per partition > 212984 usable"):
        _alloc_kernel(tmp_path, "(128, 212984 // 4 + 1)")(X)


def test_more_than_eight_psum_tiles(tmp_path: Path) -> None:
    lines = "\n".join(
        f"    t{i} = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)" for i in range(9)
    )
    kern = _kernel(tmp_path, f"def kern(x):\n{lines}\n" + _RETURN_COPY)
    with pytest.raises(NkiLimitError, match="more than 8 PSUM"):
        kern(X)


def _matmul_kernel(
    tmp_path: Path, k: int, m: int, n: int, dst_buffer: str = "nl.psum", src_buffer: str = "nl.sbuf"
):
    return _kernel(
        tmp_path,
        f"""
def kern(x):
    s = nl.ndarray(({k}, {m}), dtype=nl.float32, buffer={src_buffer})
    v = nl.ndarray(({k}, {n}), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=s, value=1.0)
    nisa.memset(dst=v, value=1.0)
    d = nl.ndarray(({min(m, 128)}, {min(n, 512)}), dtype=nl.float32, buffer={dst_buffer})
    nisa.nc_matmul(dst=d, stationary=s, moving=v)
"""
        + _RETURN_COPY,
    )


def test_matmul_limits(tmp_path: Path) -> None:
    _matmul_kernel(tmp_path, 128, 128, 512)(X)
    with pytest.raises(NkiLimitError, match="stationary free dimension 129"):
        _matmul_kernel(tmp_path, 128, 129, 64)(X)
    with pytest.raises(NkiLimitError, match="moving free dimension 513"):
        _matmul_kernel(tmp_path, 128, 4, 513)(X)
    with pytest.raises(
        NkiLimitError, match="partition dimension 256"
    ):  # K > 128 cannot even be allocated
        _matmul_kernel(tmp_path, 256, 4, 4)(X)
    with pytest.raises(NkiInterpreterError, match="writes PSUM"):
        _matmul_kernel(tmp_path, 8, 4, 4, dst_buffer="nl.sbuf")(X)
    with pytest.raises(NkiInterpreterError, match="must be in SBUF"):
        _matmul_kernel(tmp_path, 8, 4, 4, src_buffer="nl.psum")(X)


def test_compute_on_hbm_and_dma_rules(tmp_path: Path) -> None:
    on_hbm = _kernel(
        tmp_path,
        """
def kern(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.activation(dst=out, op=nl.relu, data=x)
    return out
""",
        name="a",
    )
    with pytest.raises(NkiInterpreterError, match="compute engines read SBUF/PSUM only"):
        on_hbm(X)
    cast = _kernel(
        tmp_path,
        """
def kern(x):
    t = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
"""
        + _RETURN_COPY,
        name="b",
    )
    # NKI 0.3+: a DMA between dtypes converts (through float32)
    np.testing.assert_array_equal(cast(X), round_bf16(X))
    from_psum = _kernel(
        tmp_path,
        """
def kern(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.psum)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
""",
        name="c",
    )
    with pytest.raises(NkiInterpreterError, match="PSUM"):
        from_psum(X)


def test_reading_unwritten_memory_raises(tmp_path: Path) -> None:
    kern = _kernel(
        tmp_path,
        """
def kern(x):
    t = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t[:, 0:3], src=x)
    o = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=o, op=nl.copy, data=t)
"""
        + _RETURN_COPY,
    )
    with pytest.raises(UninitializedReadError, match="2 element"):
        kern(X)


def test_output_not_fully_written_raises(tmp_path: Path) -> None:
    kern = _kernel(
        tmp_path,
        """
def kern(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[0:1, :], src=t[0:1, :])
    return out
""",
    )
    with pytest.raises(UninitializedReadError, match="never written"):
        kern(X)


def test_operator_called_on_tiles_is_not_modelled(tmp_path: Path) -> None:
    kern = _kernel(tmp_path, "def kern(x):\n    return nl.exp(x)\n")
    with pytest.raises(NkiInterpreterError, match="operator token"):
        kern(X)


def test_patches_must_match_exactly_once() -> None:
    with pytest.raises(ValueError, match="matches 0 times"):
        load_kernel_module("relu2", [("no such text", "x")])


def _accumulating_kernel(tmp_path: Path, loop: str):
    return _kernel(
        tmp_path,
        f"""
def kern(x):
    acc = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    ones = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    total = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.psum)
    for j in {loop}(x.shape[1]):
        nisa.tensor_tensor(dst=acc, data1=acc, data2=t[:, j : j + 1], op=nl.add)
        nisa.nc_matmul(dst=total, stationary=ones, moving=t[:, j : j + 1])
    both = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=both[:, 0:1], src=acc)
    bcast = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=bcast, src=total)
    nisa.tensor_copy(dst=both[0:1, 1:2], src=bcast)
    nisa.memset(dst=both[1:, 1:2], value=0.0)
    out = nl.ndarray((x.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=both)
    return out
""",
        name=loop.replace(".", "_"),
    )


@pytest.mark.parametrize("loop", ["nl.sequential_range", "nl.affine_range", "nl.static_range"])
def test_loop_carried_values_are_allowed_in_every_range(tmp_path: Path, loop: str) -> None:
    """NKI 0.3+: affine/sequential/static_range are aliases of range (run in order)."""
    got = _accumulating_kernel(tmp_path, loop)(X)
    np.testing.assert_allclose(got[:, 0], X.sum(axis=1), rtol=1e-6)
    assert got[0, 1] == pytest.approx(X.sum())  # PSUM accumulation over the loop


def test_psum_accumulation_across_affine_iterations_is_allowed(tmp_path: Path) -> None:
    kern = _kernel(
        tmp_path,
        """
def kern(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    ones = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=ones, value=1.0)
    total = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(2):
        nisa.nc_matmul(dst=total, stationary=ones, moving=t)
    s = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=s, src=total)
    out = nl.ndarray((1, x.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=s)
    return out
""",
    )
    np.testing.assert_allclose(kern(X)[0], 2 * X.sum(axis=0), rtol=1e-6)
