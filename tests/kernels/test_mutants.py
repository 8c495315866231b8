"""Planted bugs in the real kernel sources must fail the checks that guard them.

The mutants are the shipped kernel files with one textual change applied at load time
(``load_kernel_module(name, patches=...)`` insists each patch matches exactly once, so a
refactor of the kernel that removes the patched line fails here loudly, not silently):

- attention with an off-by-one causal mask (each query also sees the next key): the
  bug that gave a team a val_bpb of 0.0015;
- relu2 / rmsnorm tiled over 256 partitions (the hardware has 128);
- polar_express's list comprehension (the NKI front-end rejects it) put back;
- polar_express without the floor before sqrt: the zero-gradient Muon step gives NaN;
- relu2 and attention with every program of the LNC grid doing all the work (a race
  between the two physical cores: each output element written twice).

(NKI 0.3+ runs ``affine_range`` in order and allows loop-carried values, so the old
mutant "cross-entropy's carried softmax state in an affine_range" is now a test that
the kernel stays correct with it.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.testing import (
    GridCoverageError,
    NkiLimitError,
    NkiSubsetError,
    bf16,
    load_kernel_module,
)
from trnfrontier.runtime import muon
from trnfrontier.runtime.kernels import references

CAUSAL_OFF_BY_ONE = [("offset=q0 - k0,", "offset=q0 - k0 + 1,")]
TILE_OVER_128 = [("PMAX = 128  # partitions per tile", "PMAX = 256  # partitions per tile")]


def _attention_inputs(t: int = 130):
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 2, t, 16)).astype(np.float32)
    k = rng.standard_normal((1, 1, t, 16)).astype(np.float32)
    v = rng.standard_normal((1, 1, t, 16)).astype(np.float32)
    return q, k, v


def test_shipped_attention_passes_the_check_the_mutant_fails() -> None:
    q, k, v = _attention_inputs()
    ref = references.attention(*map(torch.from_numpy, (q, k, v)), 0.25).numpy()
    good, _ = load_kernel_module("attention").attention_fwd(q, k, v, 0.25)
    np.testing.assert_allclose(good, ref, rtol=2e-5, atol=2e-5)

    mutant, _ = load_kernel_module("attention", CAUSAL_OFF_BY_ONE).attention_fwd(q, k, v, 0.25)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(mutant, ref, rtol=2e-5, atol=2e-5)
    # and the failure is the leak itself: row t now depends on key t + 1
    leaked = np.abs(mutant - ref).max(axis=(0, 1, 3))
    assert leaked[:-1].min() > 0 and leaked[-1] == pytest.approx(0, abs=1e-5)


def test_mutant_attention_fails_a_causality_probe() -> None:
    """Changing a future token must not change earlier outputs: the mutant violates it."""
    q, k, v = _attention_inputs(40)
    k2, v2 = k.copy(), v.copy()
    k2[:, :, 20:] += 5.0
    v2[:, :, 20:] -= 5.0
    for patches, causal in (((), True), (CAUSAL_OFF_BY_ONE, False)):
        kern = load_kernel_module("attention", patches).attention_fwd
        a, _ = kern(q, k, v, 0.25)
        b, _ = kern(q, k2, v2, 0.25)
        unchanged = np.allclose(a[:, :, :20], b[:, :, :20], atol=1e-6)
        assert unchanged is causal


@pytest.mark.parametrize("name", ["relu2", "rmsnorm"])
def test_tile_over_128_partitions_is_rejected(name: str) -> None:
    patches = TILE_OVER_128 if name == "relu2" else [("PMAX = 128\n", "PMAX = 256\n")]
    x = np.random.default_rng(0).standard_normal((300, 64)).astype(np.float32)
    mutant = load_kernel_module(name, patches)
    with pytest.raises(NkiLimitError, match="partition dimension 256 > 128"):
        if name == "relu2":
            mutant.relu2_fwd(x)
        else:
            mutant.rmsnorm_fwd(x, 1e-6)


def test_carried_softmax_state_in_an_affine_loop_is_allowed() -> None:
    patch = [
        (
            "for c0 in nl.static_range(0, v, VCHUNK):  # loop-carried",
            "for c0 in nl.affine_range(0, v, VCHUNK):  # loop-carried",
        )
    ]
    rng = np.random.default_rng(3)
    z = rng.standard_normal((20, 1100)).astype(np.float32)
    t = rng.integers(0, 1100, (20, 1)).astype(np.float32)
    want = load_kernel_module("cross_entropy").cross_entropy_fwd(z, t, 15.0)
    got = load_kernel_module("cross_entropy", patch).cross_entropy_fwd(z, t, 15.0)
    np.testing.assert_array_equal(got[0], want[0])


COMPREHENSION = [
    (
        "    for i in nl.static_range(-(-m // PMAX)):\n        r0 = i * PMAX\n        rows = min(PMAX, m - r0)\n        nisa.dma_copy(",
        "    for i in nl.static_range(len([r for r in range(0, m, PMAX)])):\n        r0 = i * PMAX\n        rows = min(PMAX, m - r0)\n        nisa.dma_copy(",
    )
]


def test_polar_express_comprehension_is_rejected_before_it_runs() -> None:
    load_kernel_module("polar_express")
    with pytest.raises(
        NkiSubsetError, match=r"polar_express.py:\d+: _load\(\) uses a list comprehension"
    ):
        load_kernel_module("polar_express", COMPREHENSION)


NO_SQRT_FLOOR = [
    (
        "    nisa.tensor_scalar(dst=inv, data=bcast_ps, op0=nl.maximum, operand0=SQRT_MIN)\n"
        "    nisa.activation(dst=inv, op=nl.sqrt, data=inv)",
        "    nisa.activation(dst=inv, op=nl.sqrt, data=bcast_ps)",
    )
]


def test_zero_gradient_step_without_the_sqrt_floor_is_nan() -> None:
    g = np.zeros((1, 8, 16), dtype=np.float32)
    coeffs = muon.POLAR_EXPRESS_COEFFS
    good = load_kernel_module("polar_express").polar_express_fwd(bf16(g), coeffs, 1e-7)
    assert (good == 0).all()
    bad = load_kernel_module("polar_express", NO_SQRT_FLOOR).polar_express_fwd(
        bf16(g), coeffs, 1e-7
    )
    assert np.isnan(bad).all()


EVERY_PROGRAM_DOES_ALL = [
    (
        "    return pid * base + min(pid, extra), base + (1 if pid < extra else 0)",
        "    return 0, n_items",
    )
]


@pytest.mark.parametrize("name", ["relu2", "attention"])
def test_programs_that_do_not_split_the_work_are_a_race(name: str) -> None:
    mutant = load_kernel_module(name, EVERY_PROGRAM_DOES_ALL)
    if name == "relu2":
        x = np.random.default_rng(1).standard_normal((256, 8)).astype(np.float32)
        mutant.relu2_fwd[1](x)  # one program: nothing to race with
        with pytest.raises(GridCoverageError, match="more than one of the 2 programs"):
            mutant.relu2_fwd[2](x)
    else:
        q, k, v = _attention_inputs(20)
        mutant.attention_fwd[1](q, k, v, 0.25)
        with pytest.raises(GridCoverageError, match="more than one of the 2 programs"):
            mutant.attention_fwd[2](q, k, v, 0.25)


def test_backward_causal_off_by_one_is_caught() -> None:
    """The backward's mask leaks key t + 1 into query t: its gradients stop matching."""
    q, k, v = _attention_inputs(40)
    do = np.random.default_rng(2).standard_normal(q.shape).astype(np.float32)
    o, lse = load_kernel_module("attention").attention_fwd(q, k, v, 0.25)
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    want = torch.autograd.grad(references.attention(*leaves, 0.25), leaves, torch.tensor(do))
    for patches, matches in (((), True), (CAUSAL_OFF_BY_ONE, False)):
        kern = load_kernel_module("attention_bwd", patches).attention_bwd
        got = kern[2](q, k, v, o, do, lse, 0.25)
        close = all(
            np.allclose(g, w.numpy(), rtol=1e-4, atol=1e-4) for g, w in zip(got, want, strict=True)
        )
        assert close is matches


CE_GROUP_ROWS_CONSECUTIVE = [
    (
        "_fwd_rows(z, idx, stats[0], stats[1], stats[2], r0 + j, g, PMAX, cap)",
        "_fwd_rows(z, idx, stats[0], stats[1], stats[2], r0 + j * PMAX, 1, PMAX, cap)",
    )
]


def test_cross_entropy_group_rows_must_match_the_stats_layout() -> None:
    """Tile j of a row group reads rows r + p * g + j so the [128, g] stats tile is in the
    rows' flat order; reading consecutive rows instead stores every loss in a wrong row."""
    rng = np.random.default_rng(5)
    z = rng.standard_normal((512, 300)).astype(np.float32)
    t = rng.integers(0, 300, (512, 1)).astype(np.float32)
    want, _ = references.cross_entropy(torch.from_numpy(z), torch.from_numpy(t[:, 0]).long(), 15.0)
    good, _ = load_kernel_module("cross_entropy").cross_entropy_fwd(z, t, 15.0)
    np.testing.assert_allclose(good[:, 0], want.numpy(), rtol=1e-5, atol=2e-5)
    bad, _ = load_kernel_module("cross_entropy", CE_GROUP_ROWS_CONSECUTIVE).cross_entropy_fwd(
        z, t, 15.0
    )
    assert not np.allclose(bad[:, 0], want.numpy(), rtol=1e-3, atol=1e-3)


ROPE_SWAPPED_ANGLES = [
    (
        "    c = cs[0:parts].expand_dim(2).broadcast(2, heads)",
        "    c = sn[0:parts].expand_dim(2).broadcast(2, heads)",
    )
]


def test_rope_all_heads_rotation_with_the_wrong_angle_is_caught() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 130, 3, 16)).astype(np.float32)  # [B, T, H, D]
    ang = rng.uniform(0, 3, (130, 8))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    want, _ = references.rope_qknorm(
        torch.from_numpy(x.transpose(0, 2, 1, 3).copy()),
        torch.from_numpy(cos),
        torch.from_numpy(sin),
        1e-6,
        True,
    )
    want_t = want.numpy().transpose(0, 2, 1, 3)
    for patches, matches in (((), True), (ROPE_SWAPPED_ANGLES, False)):
        y, _ = load_kernel_module("rope_qknorm", patches).rope_qknorm_fwd(x, cos, sin, 1e-6, True)
        assert np.allclose(y, want_t, rtol=1e-4, atol=1e-5) is matches


DQ_NOT_ACCUMULATED = [
    (
        "nisa.nc_matmul(dst=dq_ps[0:rq, :], stationary=dsT[0:kk, 0:rq], moving=kr[0:kk, j, :])",
        "nisa.nc_matmul(\n            dst=dq_ps[0:rq, :], stationary=dsT[0:kk, 0:rq], "
        "moving=kr[0:kk, j, :], accumulate=False\n        )",
    )
]


def test_backward_dq_must_accumulate_over_every_key_block() -> None:
    """dQ of a query tile accumulates in one PSUM tile over all 128-key sub-tiles of all
    512-key blocks; restarting it per sub-tile keeps only the last block's share."""
    q, k, v = _attention_inputs(600)
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float32)
    o, lse = load_kernel_module("attention").attention_fwd(q, k, v, 0.25)
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    want = torch.autograd.grad(references.attention(*leaves, 0.25), leaves, torch.tensor(do))
    for patches, matches in (((), True), (DQ_NOT_ACCUMULATED, False)):
        dq, _, _ = load_kernel_module("attention_bwd", patches).attention_bwd(
            q, k, v, o, do, lse, 0.25
        )
        assert np.allclose(dq, want[0].numpy(), rtol=1e-4, atol=1e-4) is matches


RMSNORM_ONE_RSTD_PER_PARTITION = [
    (
        "        data2=rs[0:parts, :].expand_dim(2).broadcast(2, d),\n        op=nl.multiply,\n    )\n"
        "    nisa.dma_copy(dst=y",
        "        data2=rs[0:parts, 0:1].expand_dim(2).broadcast(1, g).broadcast(2, d),\n"
        "        op=nl.multiply,\n    )\n    nisa.dma_copy(dst=y",
    )
]


def test_rmsnorm_row_groups_need_each_rows_own_rstd() -> None:
    """A group holds g rows per partition: scaling all of them by the first row's rstd
    is wrong for every row but the first of each partition."""
    x = np.random.default_rng(8).standard_normal((512, 64)).astype(np.float32)
    want, _ = references.rmsnorm(torch.from_numpy(x), 1e-6)
    good, _ = load_kernel_module("rmsnorm").rmsnorm_fwd(x, 1e-6)
    np.testing.assert_allclose(good, want.numpy(), rtol=1e-5, atol=1e-5)
    bad, _ = load_kernel_module("rmsnorm", RMSNORM_ONE_RSTD_PER_PARTITION).rmsnorm_fwd(x, 1e-6)
    assert not np.allclose(bad, want.numpy(), rtol=1e-3, atol=1e-3)
