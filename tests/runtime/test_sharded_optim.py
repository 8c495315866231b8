"""The sharded optimizer (runtime/sharded_optim.py) on gloo CPU ranks: the same bits as
the replicated optimizers on the same gradients, at 2 and 4 ranks, through a checkpoint
in the replicated layout and a resume (tests/runtime/sharded_ranks.py runs each rank)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gloo_ranks import assert_ranks_ok, run_ranks
from trnfrontier.runtime.sharded_optim import resolve_sharded, sharding_is_exact

SCRIPT = Path(__file__).with_name("sharded_ranks.py")


def _run(tmp_path: Path, world: int, grads: str, clip: float, env: dict[str, str] | None = None) -> None:
    results = run_ranks(SCRIPT, world, [grads, str(clip), str(tmp_path / "optim.pt")], env=env)
    assert_ranks_ok(results)
    verdict = "within tolerance" if clip else "bit for bit"
    assert all(verdict in out for _, out, _ in results)


def test_two_ranks_update_bit_for_bit_on_random_gradients(tmp_path: Path) -> None:
    """Two ranks: the averaged gradient is the same bits as DDP's (a + b commutes), so the
    whole update must be too, Muon (NorMuon, cautious decay) and AdamW, before and after
    a checkpoint gathered to rank 0 and a resume from it."""
    _run(tmp_path, 2, "random", 0.0)


@pytest.mark.slow
def test_four_ranks_update_bit_for_bit_on_exactly_summed_gradients(tmp_path: Path) -> None:
    """Four ranks own 1-2 matrices of each bucket (some none) and a quarter of each
    embedding's rows; gradients whose sum is exact in any order isolate the optimizer."""
    _run(tmp_path, 4, "dyadic", 0.0)


@pytest.mark.slow
def test_clipping_from_shards_matches_clip_grad_norm(tmp_path: Path) -> None:
    """The global norm summed from the shards clips as clip_grad_norm_ does (up to the
    order of the sum: Polar Express in float32 keeps that rounding from being amplified)."""
    _run(tmp_path, 2, "random", 0.5, env={"TRNF_CPU_POLAR": "float32"})


@pytest.mark.parametrize(
    ("setting", "world", "clip", "expected"),
    [
        ("auto", 1, 0.0, False),
        ("auto", 4, 0.0, True),
        ("auto", 4, 1.0, False),  # clipping's norm is summed in another order
        (True, 4, 1.0, True),
        (True, 1, 0.0, False),  # nothing to split
        (False, 8, 0.0, False),
    ],
)
def test_optim_sharded_setting(setting: bool | str, world: int, clip: float, expected: bool) -> None:
    assert resolve_sharded(setting, world, clip) is expected
    assert sharding_is_exact(world, clip) is (world > 1 and clip == 0)


def test_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="expected true, false or auto"):
        resolve_sharded("yes", 2, 0.0)


def test_padding_to_many_ranks_costs_one_shared_chunk() -> None:
    """22 matrices on 128 ranks: the tensor-form reduce would stack 128 (106 of them zero);
    the list form allocates the 22 real chunks and one zero chunk every other rank shares."""
    from types import SimpleNamespace

    import torch

    from trnfrontier.runtime.sharded_optim import ShardedUpdate, _Bucket

    params = [torch.zeros(8, 4) for _ in range(22)]
    bucket = _Bucket(opt=None, group={}, params=params, chunk=1, start=0)  # type: ignore[arg-type]
    grads = [torch.full((8, 4), float(i)) for i in range(22)]
    chunks = ShardedUpdate._rank_chunks(SimpleNamespace(world=128), bucket, grads)  # type: ignore[arg-type]
    assert len(chunks) == 128 and all(c.shape == (1, 8, 4) for c in chunks)
    assert len({c.data_ptr() for c in chunks}) == 23
    assert all(torch.equal(chunks[i][0], grads[i]) for i in range(22))
    assert all(c is chunks[22] and not c.any() for c in chunks[22:])
