"""Each documented NKI rule the interpreter enforces, with a small mutant kernel it catches
(sources per rule in kernels/README.md, section 6)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from kernels.testing import (
    GridCoverageError,
    NkiInterpreterError,
    NkiSubsetError,
    PsumAccumulateError,
    bf16,
    load_kernel_module,
    machine,
    round_bf16,
)

HEADER = "import nki\nimport nki.language as nl\nimport nki.isa as nisa\n\n\n"
X = np.array([[1.0, -2.0, 3.0, 0.5], [-0.5, 0.25, 4.0, 2.0]], dtype=np.float32)


def _load(tmp_path: Path, body: str, name: str = "k", nki_version: str | None = None):
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER + "@nki.jit\n" + textwrap.dedent(body))
    return load_kernel_module(str(path), nki_version=nki_version).kern


def _unary_kernel(tmp_path: Path, lines: str, name: str = "k", dtype: str = "x.dtype"):
    """kern(x) = out where `lines` compute tile o (float32, x's shape) from tile t (= x)."""
    return _load(
        tmp_path,
        f"""
def kern(x):
    t = nl.ndarray(x.shape, dtype={dtype}, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    o = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
{textwrap.indent(textwrap.dedent(lines), "    ")}
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=o)
    return out
""",
        name,
    )


# ---------------------------------------------------------------- the Python subset

SUBSET_MUTANTS = {
    "list comprehension": "n = len([i for i in range(3)])",
    "generator expression": "n = sum(i for i in range(3))",
    "lambda": "f = lambda a: a",
    "try statement": "try:\n        n = 1\n    except Exception:\n        n = 2",
    "with statement": "with open('x'):\n        pass",
    "tuple target": "for a, b in ((1, 2),):\n        pass",
    "nested function": "def g():\n        return 1",
    "raise statement": "raise ValueError('x')",
    "starred expression": "a = (*x.shape,)",
    "keyword expansion": "nisa.memset(**{})",
}


def _subset_kernel(line: str) -> str:
    return f"""
def kern(x):
    {line}
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=x)
    return out
"""


@pytest.mark.parametrize("what", sorted(SUBSET_MUTANTS))
def test_python_outside_the_nki_subset_is_rejected_before_running(
    tmp_path: Path, what: str
) -> None:
    # 0.6's subset: 0.7 allows a tuple loop target (test_interpreter_versions.py)
    with pytest.raises(NkiSubsetError, match=r"k\.py:\d+: kern\(\) uses"):
        _load(tmp_path, _subset_kernel(SUBSET_MUTANTS[what]), nki_version="0.6")


def test_subset_allows_what_kernels_need_and_checks_helpers(tmp_path: Path) -> None:
    ok = _load(tmp_path, _subset_kernel("a, b = x.shape[0], min(3, 4) if True else 2"), "ok")
    np.testing.assert_array_equal(ok(X), X)
    (tmp_path / "h.py").write_text(
        HEADER
        + "def helper(n):\n    return [i for i in range(n)]\n\n\n@nki.jit\n"
        + textwrap.dedent(_subset_kernel("n = 1"))
    )
    with pytest.raises(NkiSubsetError, match=r"helper\(\) uses a list comprehension"):
        load_kernel_module(str(tmp_path / "h.py"))


# ---------------------------------------------------------------- dtype rules per call

MATMUL = """
def kern(s, m):
    st = nl.ndarray(s.shape, dtype=s.dtype, buffer=nl.sbuf)
    mv = nl.ndarray(m.shape, dtype=m.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=s)
    nisa.dma_copy(dst=mv, src=m)
    acc = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=st, moving=mv)
    o = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o, src=acc)
    out = nl.ndarray((s.shape[1], m.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=o)
    return out
"""


def test_matmul_float32_operand_needs_a_float32_partner(tmp_path: Path) -> None:
    kern = _load(tmp_path, MATMUL)
    s, m = X[:, :3], X
    np.testing.assert_allclose(kern(bf16(s), bf16(m)), round_bf16(s).T @ round_bf16(m), rtol=1e-6)
    np.testing.assert_allclose(kern(s, m), s.T @ m, rtol=1e-6)
    with pytest.raises(NkiInterpreterError, match="float32 the other must be float32"):
        kern(s, bf16(m))  # the mutant: an fp32 x bf16 matmul


def test_tensor_scalar_vector_operand_must_be_float32(tmp_path: Path) -> None:
    lines = """
v = nl.ndarray((x.shape[0], 1), dtype={dt}, buffer=nl.sbuf)
nisa.tensor_copy(dst=v, src=t[:, 0:1])
nisa.tensor_scalar(dst=o, data=t, op0=nl.multiply, operand0=v)
"""
    good = _unary_kernel(tmp_path, lines.format(dt="nl.float32"), "good")
    np.testing.assert_allclose(good(X), X * X[:, :1])
    bad = _unary_kernel(tmp_path, lines.format(dt="nl.bfloat16"), "bad")
    with pytest.raises(NkiInterpreterError, match="operand0: a vector operand must be float32"):
        bad(X)


def test_activation_scale_vector_must_be_float32_bias_may_not(tmp_path: Path) -> None:
    lines = """
v = nl.ndarray((x.shape[0], 1), dtype=nl.bfloat16, buffer=nl.sbuf)
nisa.tensor_copy(dst=v, src=t[:, 0:1])
nisa.activation(dst=o, op=nl.copy, data=t, {arg}=v)
"""
    bias = _unary_kernel(tmp_path, lines.format(arg="bias"), "bias")
    np.testing.assert_allclose(bias(X), X + round_bf16(X[:, :1]))
    scale = _unary_kernel(tmp_path, lines.format(arg="scale"), "scale")
    with pytest.raises(NkiInterpreterError, match="scale: a vector operand must be float32"):
        scale(X)


# ---------------------------------------------------------------- PSUM accumulation


def _psum_kernel(tmp_path: Path, first: str, accumulate: str, name: str):
    return _load(
        tmp_path,
        f"""
def kern(s):
    st = nl.ndarray(s.shape, dtype=s.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=st, src=s)
    acc = nl.ndarray((s.shape[1], s.shape[1]), dtype=nl.float32, buffer=nl.psum)
    {first}
    nisa.nc_matmul(dst=acc, stationary=st, moving=st, accumulate={accumulate})
    o = nl.ndarray((s.shape[1], s.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=o, src=acc)
    out = nl.ndarray((s.shape[1], s.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=o)
    return out
""",
        name,
    )


def test_psum_overwrite_versus_accumulate(tmp_path: Path) -> None:
    gram = X.T @ X
    matmul = "nisa.nc_matmul(dst=acc, stationary=st, moving=st)"
    memset = "nisa.memset(dst=acc, value=1.0)"
    np.testing.assert_allclose(_psum_kernel(tmp_path, matmul, "None", "a")(X), 2 * gram, rtol=1e-6)
    np.testing.assert_allclose(_psum_kernel(tmp_path, matmul, "True", "b")(X), 2 * gram, rtol=1e-6)
    np.testing.assert_allclose(_psum_kernel(tmp_path, memset, "False", "c")(X), gram, rtol=1e-6)
    # the mutants: accumulating onto a memset PSUM tile (undefined on the hardware), and
    # accumulate=True on a PSUM tile no matmul initialised
    with pytest.raises(PsumAccumulateError, match="not written by an earlier matmul"):
        _psum_kernel(tmp_path, memset, "None", "d")(X)
    with pytest.raises(PsumAccumulateError):
        _psum_kernel(tmp_path, memset, "True", "e")(X)
    with pytest.raises(PsumAccumulateError):
        _psum_kernel(tmp_path, "pass", "True", "f")(X)


# ---------------------------------------------------------------- Scalar Engine ranges


@pytest.mark.parametrize(
    ("op", "inside", "outside"),
    [
        ("nl.sqrt", 4.0, 0.0),
        ("nl.rsqrt", 4.0, 0.0),
        ("nl.log", 1.0, 0.0),
        ("nl.sqrt", 2.0**-100, 2.0**-120),
        ("nl.rsqrt", 2.0**90, 2.0**100),
        ("nl.log", 2.0**60, -1.0),
    ],
)
def test_scalar_engine_input_outside_the_valid_range_is_nan(
    tmp_path: Path, op: str, inside: float, outside: float
) -> None:
    kern = _unary_kernel(tmp_path, f"nisa.activation(dst=o, op={op}, data=t)")
    got = kern(np.array([[inside, outside]], dtype=np.float32))
    assert np.isfinite(got[0, 0]) and np.isnan(got[0, 1])


# ---------------------------------------------------------------- DMA


def test_dma_converts_dtypes_and_copies_sbuf_to_sbuf(tmp_path: Path) -> None:
    kern = _unary_kernel(
        tmp_path,
        """
b = nl.ndarray(x.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
nisa.dma_copy(dst=b, src=t)
nisa.dma_copy(dst=o, src=b)
""",
    )
    y = X * 1.001
    np.testing.assert_array_equal(kern(y), round_bf16(y))


# ---------------------------------------------------------------- partition dimension


def test_int_index_keeps_the_partition_dimension_on_chip_only() -> None:
    machine.STATE.allocator = machine.Allocator()
    try:
        sb = machine.Tensor((4, 8, 2), machine.float32, machine.sbuf)
        hb = machine.Tensor((4, 8, 2), machine.float32, machine.hbm)
        assert sb[0, :, :].shape == (1, 8, 2)
        assert sb[1:3][0].shape == (1, 8, 2)
        assert sb[2, 3].shape == (1, 2)
        assert hb[0, :, :].shape == (8, 2)
        assert hb[2, 3].shape == (2,)
    finally:
        machine.STATE.allocator = None


def test_partition_row_as_a_2d_operand(tmp_path: Path) -> None:
    kern = _unary_kernel(
        tmp_path,
        """
nisa.memset(dst=o, value=0.0)
nisa.activation(dst=o[1, :], op=nl.square, data=t[0, :])
""",
    )
    got = kern(X)
    np.testing.assert_allclose(got[1], X[0] ** 2)
    assert (got[0] == 0).all()


# ---------------------------------------------------------------- the LNC launch grid

SPLIT = """
def kern(x):
    n = x.shape[0]
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    per = n // nl.num_programs(0)
    {rows}
    t = nl.ndarray((per, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[r0 : r0 + per, :])
    nisa.dma_copy(dst=out[r0 : r0 + per, :], src=t)
    return out
"""


def test_grid_programs_must_cover_each_output_element_once(tmp_path: Path) -> None:
    good = _load(tmp_path, SPLIT.format(rows="r0 = nl.program_id(0) * per"), "good")
    np.testing.assert_array_equal(good(X), X)
    np.testing.assert_array_equal(good[1](X), X)
    np.testing.assert_array_equal(good[2](X), X)
    overlap = _load(tmp_path, SPLIT.format(rows="r0 = 0\n    per = n"), "overlap")
    with pytest.raises(GridCoverageError, match="more than one of the 2 programs"):
        overlap[2](X)
    gap = _load(tmp_path, SPLIT.format(rows="r0 = nl.program_id(0)\n    per = 1"), "gap")
    np.testing.assert_array_equal(gap[2](X), X)  # two rows, one each
    with pytest.raises(machine.UninitializedReadError, match="never written"):
        gap[1](X)  # one program covers one row of two
    with pytest.raises(NkiInterpreterError, match="LNC degree"):
        good[4](X)
