"""The interpreter as a model of a named NKI version: for each rule fixed in the second
pass (kernels/README.md, section 6, "Rules by version"), a legal probe it must accept and
an illegal one it must refuse, under the NKI version(s) the rule holds for."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from kernels.testing import (
    NkiInterpreterError,
    NkiLimitError,
    NkiSubsetError,
    load_kernel_module,
    versions,
)

HEADER = "import nki\nimport nki.language as nl\nimport nki.isa as nisa\n\n\n"
X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3.0
BOTH = ["0.6", "0.7"]


def _kern(tmp_path: Path, body: str, version: str = "0.6", name: str = "k", portable=False):
    path = tmp_path / f"{name}_{version.replace('.', '')}.py"
    path.write_text(HEADER + "@nki.jit\n" + textwrap.dedent(body))
    return load_kernel_module(str(path), nki_version=version, portable=portable).kern


def _tile_body(lines: str, out: str = "o") -> str:
    """kern(x): t = x in SBUF; `lines` compute float32 tile o of x's shape; returns `out`."""
    return f"""
def kern(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    o = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
{textwrap.indent(textwrap.dedent(lines), "    ")}
    res = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=res, src={out})
    return res
"""


# ---------------------------------------------------------------- the ALU operator table


@pytest.mark.parametrize("version", BOTH)
def test_divide_is_not_an_alu_operator(tmp_path: Path, version: str) -> None:
    legal = _kern(
        tmp_path,
        _tile_body(
            "r = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)\n"
            "nisa.reciprocal(dst=r, data=t)\n"
            "nisa.tensor_tensor(dst=o, data1=t, data2=r, op=nl.multiply)"
        ),
        version,
        "legal",
    )
    np.testing.assert_allclose(legal(X + 10), np.ones_like(X), rtol=1e-6)
    for call in (
        "nisa.tensor_tensor(dst=o, data1=t, data2=t, op=nl.divide)",
        "nisa.tensor_scalar(dst=o, data=t, op0=nl.divide, operand0=2.0)",
    ):
        illegal = _kern(tmp_path, _tile_body(call), version, "illegal")
        with pytest.raises(NkiInterpreterError, match="not an operator of the engines' ALU"):
            illegal(X + 10)


# ---------------------------------------------------------------- affine_select memories

SELECT = """
p = nl.ndarray(x.shape, dtype=nl.float32, buffer={src})
nisa.tensor_copy(dst=p, src=t)
d = nl.ndarray(x.shape, dtype=nl.float32, buffer={dst})
nisa.affine_select(dst=d, pattern=[[-1, 4]], channel_multiplier=1, on_true_tile=p,
                   on_false_value=-9.0, cmp_op=nl.greater_equal, offset=0)
nisa.tensor_copy(dst=o, src=d)
"""


@pytest.mark.parametrize("version", BOTH)
def test_affine_select_reads_and_writes_sbuf_only(tmp_path: Path, version: str) -> None:
    legal = _kern(tmp_path, _tile_body(SELECT.format(src="nl.sbuf", dst="nl.sbuf")), version)
    want = np.where(np.arange(2)[:, None] >= np.arange(4)[None], X, -9)
    np.testing.assert_array_equal(legal(X), want)
    for src, dst in (("nl.psum", "nl.sbuf"), ("nl.sbuf", "nl.psum")):
        body = _tile_body(SELECT.format(src=src, dst=dst))
        with pytest.raises(NkiInterpreterError, match="must be in SBUF"):
            _kern(tmp_path, body, version, "bad")(X)


# ---------------------------------------------------------------- SBUF and PSUM by lifetime


def test_a_200_KiB_sbuf_tile_fits_trn2(tmp_path: Path) -> None:
    body = _tile_body(
        "big = nl.ndarray((2, 200 * 256), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.memset(dst=big, value=1.0)\n"
        "nisa.tensor_copy(dst=o, src=big[:, 0:4])"
    )
    np.testing.assert_array_equal(_kern(tmp_path, body)(X), np.ones_like(X))


TWO_TILES = """
a = nl.ndarray((2, 120 * 256), dtype=nl.float32, buffer=nl.sbuf)
nisa.memset(dst=a, value=1.0)
{between}
b = nl.ndarray((2, 120 * 256), dtype=nl.float32, buffer=nl.sbuf)
nisa.memset(dst=b, value=2.0)
nisa.tensor_tensor(dst=o, data1={last}[:, 0:4], data2=t, op=nl.add)
"""


def test_sbuf_capacity_counts_live_tiles(tmp_path: Path) -> None:
    # two 120 KiB tiles whose lifetimes do not overlap: one buffer's worth
    seq = _tile_body(TWO_TILES.format(between="nisa.tensor_copy(dst=o, src=a[:, 0:4])", last="b"))
    np.testing.assert_array_equal(_kern(tmp_path, seq, name="seq")(X), X + 2)
    both = _tile_body(TWO_TILES.format(between="", last="a") + "nisa.tensor_copy(dst=o, src=b[:, 0:4])")
    with pytest.raises(NkiLimitError, match="SBUF over capacity: 245792 bytes per partition live"):
        _kern(tmp_path, both, name="both")(X)


PSUM_ROUNDS = """
for i in nl.static_range({n}):
    ps = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.psum)
    nisa.tensor_copy(dst=ps, src=t)
    nisa.tensor_copy(dst=o, src=ps)
"""


def test_psum_banks_count_live_tiles_not_allocation_sites(tmp_path: Path) -> None:
    sites = "".join(
        f"ps{i} = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.psum)\n"
        f"nisa.tensor_copy(dst=ps{i}, src=t)\n"
        f"nisa.tensor_copy(dst=o, src=ps{i})\n"
        for i in range(10)
    )
    # ten sites, each dead before the next is born: legal
    np.testing.assert_array_equal(_kern(tmp_path, _tile_body(sites), name="sites")(X), X)
    np.testing.assert_array_equal(_kern(tmp_path, _tile_body(PSUM_ROUNDS.format(n=10)))(X), X)
    live = "".join(
        f"ps{i} = nl.ndarray((2, 4), dtype=nl.float32, buffer=nl.psum)\n"
        f"nisa.tensor_copy(dst=ps{i}, src=t)\n"
        for i in range(9)
    ) + "".join(f"nisa.tensor_copy(dst=o, src=ps{i})\n" for i in range(9))
    with pytest.raises(NkiLimitError, match="more than 8 PSUM banks live at once: 9"):
        _kern(tmp_path, _tile_body(live), name="live")(X)


# ---------------------------------------------------------------- HBM outputs and DMA shapes

OUT_IN = """
def kern(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer={buffer})
    nisa.dma_copy(dst=out[nl.program_id(0) : nl.program_id(0) + 1, :],
                  src=t[nl.program_id(0) : nl.program_id(0) + 1, :])
    if nl.num_programs(0) == 1:
        nisa.dma_copy(dst=out[1:2, :], src=t[1:2, :])
    return out
"""


@pytest.mark.parametrize("version", BOTH)
def test_outputs_in_private_hbm_only_without_a_grid(tmp_path: Path, version: str) -> None:
    private = _kern(tmp_path, OUT_IN.format(buffer="nl.hbm"), version)
    np.testing.assert_array_equal(private(X), X)  # nl.hbm is private_hbm: fine alone
    with pytest.raises(NkiInterpreterError, match="nl.shared_hbm under an LNC grid"):
        private[2](X)
    shared = _kern(tmp_path, OUT_IN.format(buffer="nl.shared_hbm"), version, "shared")
    np.testing.assert_array_equal(shared[2](X), X)


@pytest.mark.parametrize("version", BOTH)
def test_dma_copies_equal_element_counts_in_flat_order(tmp_path: Path, version: str) -> None:
    body = """
def kern(x):
    t = nl.ndarray((4, 2), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray((1, {n}), dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out
"""
    got = _kern(tmp_path, body.format(n=8), version)(X)
    np.testing.assert_array_equal(got, X.reshape(1, 8))
    with pytest.raises(NkiInterpreterError, match="holds 7 elements, src \\(4, 2\\) holds 8"):
        _kern(tmp_path, body.format(n=7), version, "bad")(X)


@pytest.mark.parametrize("version", BOTH)
def test_step_slices(tmp_path: Path, version: str) -> None:
    legal = _kern(
        tmp_path,
        _tile_body(
            "nisa.memset(dst=o, value=0.0)\n"
            "nisa.tensor_copy(dst=o[:, 0:4:2], src=t[:, 1:4:2])\n"
            "nisa.tensor_copy(dst=o[0:2:1, 1:4:2][:, 1:2], src=t[:, 0:1])"
        ),
        version,
    )
    want = np.zeros_like(X)
    want[:, [0, 2]] = X[:, [1, 3]]
    want[:, 3] = X[:, 0]
    np.testing.assert_array_equal(legal(X), want)
    with pytest.raises(NkiInterpreterError, match="only positive steps"):
        _kern(tmp_path, _tile_body("nisa.tensor_copy(dst=o, src=t[:, ::-1])"), version, "r")(X)


# ---------------------------------------------------------------- the Python subset


@pytest.mark.parametrize("version", BOTH)
def test_a_static_while_is_legal_nki_but_not_this_repositorys_style(
    tmp_path: Path, version: str
) -> None:
    body = _tile_body(
        "nisa.tensor_copy(dst=o, src=t)\n"
        "i = 0\n"
        "while i < 3:\n"
        "    nisa.tensor_scalar(dst=o, data=o, op0=nl.add, operand0=1.0)\n"
        "    i += 1\n"
        "name = f'{i}'\n"
        "d = {'a': 1}"
    )
    np.testing.assert_array_equal(_kern(tmp_path, body, version)(X), X + 3)
    with pytest.raises(NkiSubsetError, match="a while loop \\(legal NKI, but not portable"):
        _kern(tmp_path, body, version, "style", portable=True)


@pytest.mark.parametrize("version", BOTH)
@pytest.mark.parametrize("condition", ["while t[0, 0]:", "while t:", "if o:"])
def test_a_condition_on_tile_data_is_refused(tmp_path: Path, version: str, condition: str) -> None:
    """A static while is unrolled at tracing and a dynamic one tests a register: a tile's data
    as the condition is neither (Python alone would call every tile true, and loop forever)."""
    body = _tile_body(f"nisa.tensor_copy(dst=o, src=t)\n{condition}\n    nisa.memset(dst=t, value=0.0)")
    with pytest.raises(NkiInterpreterError, match="used as a condition: tile data is not known when the kernel is traced"):
        _kern(tmp_path, body, version)(X)


REDUCE_SCALE = """
v = nl.ndarray((x.shape[0], 1), dtype={dtype}, buffer=nl.sbuf)
nisa.memset(dst=v, value=2.0)
s = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.activation_reduce(dst=o, op=nl.copy, data=t, reduce_op=nl.add, reduce_res=s, scale=v)
"""


@pytest.mark.parametrize("version", BOTH)
def test_activation_reduce_takes_a_float32_vector_scale_in_both_versions(tmp_path: Path, version: str) -> None:
    legal = _kern(tmp_path, _tile_body(REDUCE_SCALE.format(dtype="nl.float32")), version, "legal")
    np.testing.assert_array_equal(legal(X), X * 2)
    with pytest.raises(NkiInterpreterError, match="activation_reduce scale: a vector operand must be float32"):
        _kern(tmp_path, _tile_body(REDUCE_SCALE.format(dtype="nl.bfloat16")), version, "bf16")(X)


def _legal_only_in(tmp_path: Path, body: str, legal: str, want: np.ndarray, error: type, match: str):
    """``body`` runs (giving ``want``) under NKI ``legal`` and is refused under the other."""
    other = next(v for v in BOTH if v != legal)
    np.testing.assert_array_equal(_kern(tmp_path, body, legal, "legal")(X), want)
    with pytest.raises(error, match=match):
        _kern(tmp_path, body, other, "illegal")(X)


def test_tuple_loop_targets_are_legal_from_nki_0_7(tmp_path: Path) -> None:
    body = _tile_body(
        "nisa.tensor_copy(dst=o, src=t)\n"
        "for a, b in ((1.0, 2.0), (3.0, 4.0)):\n"
        "    nisa.tensor_scalar(dst=o, data=o, op0=nl.add, operand0=a, op1=nl.add, operand1=b)"
    )
    _legal_only_in(
        tmp_path, body, "0.7", X + 10, NkiSubsetError, "tuple target \\(the NKI 0.6 front-end"
    )


# ---------------------------------------------------------------- API by version

REDUCE_BIAS = """
s = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
nisa.activation_reduce(dst=o, op=nl.copy, data=t, reduce_op=nl.add, reduce_res=s, bias={bias})
"""


def test_activation_reduce_scalar_bias_from_nki_0_7(tmp_path: Path) -> None:
    vector = REDUCE_BIAS.replace(
        "s = nl", "v = nl.ndarray((x.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)\n"
        "nisa.memset(dst=v, value=1.0)\ns = nl"
    ).format(bias="v")
    for version in BOTH:
        np.testing.assert_array_equal(_kern(tmp_path, _tile_body(vector), version)(X), X + 1)
    scalar = _tile_body(REDUCE_BIAS.format(bias="1.0"))
    match = "bias must be a \\[P, 1\\] vector tile in NKI 0.6"
    _legal_only_in(tmp_path, scalar, "0.7", X + 1, NkiInterpreterError, match)


def test_dynamic_range_exists_in_nki_0_6_only(tmp_path: Path) -> None:
    body = _tile_body(
        "nisa.tensor_copy(dst=o, src=t)\n"
        "for i in nl.dynamic_range(2):\n"
        "    nisa.tensor_scalar(dst=o, data=o, op0=nl.add, operand0=1.0)"
    )
    match = "nl.dynamic_range does not exist in NKI 0.7"
    _legal_only_in(tmp_path, body, "0.6", X + 2, NkiInterpreterError, match)


def test_nki_0_7_rejects_a_grid_other_than_the_processs_lnc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = OUT_IN.format(buffer="nl.shared_hbm")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    np.testing.assert_array_equal(_kern(tmp_path, body, "0.7")[2](X), X)
    np.testing.assert_array_equal(_kern(tmp_path, body, "0.6")[1](X), X)
    with pytest.raises(NkiInterpreterError, match="NKI 0.7 rejects the mismatch"):
        _kern(tmp_path, body, "0.7")[1](X)


# ---------------------------------------------------------------- choosing the version


def test_version_choice_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(versions.ENV, raising=False)
    monkeypatch.setattr(versions, "_installed", lambda: None)
    assert versions.resolve().name == versions.DEFAULT == "0.6"
    monkeypatch.setattr(versions, "_installed", lambda: "0.7.0")
    assert versions.resolve().name == "0.7"
    monkeypatch.setattr(versions, "_installed", lambda: "0.9.2")  # newer: the newest known
    assert versions.resolve().name == "0.7"
    monkeypatch.setenv(versions.ENV, "0.6")
    assert versions.resolve().name == "0.6"
    assert versions.resolve("0.7.1").name == "0.7"
    with pytest.raises(NkiInterpreterError, match="'0.5' is not modelled"):
        versions.resolve("0.5")


# ---------------------------------------------------------------- tensor views


@pytest.mark.parametrize("version", BOTH)
def test_expand_dim_and_broadcast_views(tmp_path: Path, version: str) -> None:
    body = """
def kern(x, v):
    t = nl.ndarray((2, 3, 4), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    w = nl.ndarray((2, 4), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w, src=v)
    o = nl.ndarray((2, 3, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=o, data1=t, data2=w.expand_dim(1).broadcast(1, 3), op=nl.multiply)
    {extra}
    res = nl.ndarray((2, 3, 4), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=res, src=o)
    return res
"""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    v = np.array([[1, 2, 3, 4], [-1, -2, -3, -4]], dtype=np.float32)
    got = _kern(tmp_path, body.format(extra=""), version)(x, v)
    np.testing.assert_array_equal(got, x * v[:, None, :])
    bad = body.format(extra="nisa.tensor_copy(dst=w.expand_dim(1).broadcast(1, 3), src=o)")
    with pytest.raises(NkiInterpreterError, match="broadcast view is read-only"):
        _kern(tmp_path, bad, version, "bad")(x, v)
    along_partitions = body.format(extra="w.expand_dim(0)")
    with pytest.raises(NkiInterpreterError, match="not before the partition dimension"):
        _kern(tmp_path, along_partitions, version, "p")(x, v)
