"""contract/phases.py: each phase's facts, and the launch grammar following them."""

from __future__ import annotations

import pytest

from trnfrontier.contract.launch import (
    LNC_CHOICES,
    NPROC_CHOICES,
    LaunchError,
    launch_line,
    parse_launch,
)
from trnfrontier.contract.phases import CORES_PER_CHIP, PHASES, phase


def test_phase_1_is_the_evidenced_contract() -> None:
    one = PHASES[1]
    assert (one.chips, one.budget_seconds, one.startup_steps_excluded, one.startup_allowance_cap_seconds) == (1, 1800, 5, 900)
    assert (LNC_CHOICES, NPROC_CHOICES) == ((1, 2), (1, 4, 8)) == (one.lnc_choices, one.nproc_choices)
    assert [(m.name, m.weight, m.higher_is_better) for m in one.metrics] == [("val_bpb", 1.0, False)]
    assert not one.inference_py and one.inferred == ()


def test_phase_2_uses_the_whole_server_for_four_hours_scored_half_and_half() -> None:
    two = PHASES[2]
    assert (two.chips, two.budget_seconds, two.core_timeout_seconds) == (16, 14_400, 3_600)
    assert {(m.name, m.weight, m.higher_is_better) for m in two.metrics} == {("val_bpb", 0.5, False), ("core", 0.5, True)}
    # Every shape is one process per logical core of all 16 chips.
    for shape in two.launch_shapes:
        assert shape.nproc * shape.lnc == two.chips * CORES_PER_CHIP
    assert two.inference_py and "launch_shapes" in two.inferred


@pytest.mark.parametrize(("nproc", "lnc", "ok"), [(64, 2, True), (128, 1, True), (64, 1, False), (128, 2, False), (8, 2, False)])
def test_phase_2_launch_shapes(nproc: int, lnc: int, ok: bool) -> None:
    line = launch_line(nproc, lnc)
    if ok:
        assert (parse_launch(line, PHASES[2]).nproc, parse_launch(line, PHASES[2]).lnc) == (nproc, lnc)
    else:
        with pytest.raises(LaunchError, match="nproc_per_node"):
            parse_launch(line, PHASES[2])


def test_a_phase_1_launch_is_not_a_phase_2_one_and_back() -> None:
    with pytest.raises(LaunchError, match=r"must be --nproc_per_node=64 or 128"):
        parse_launch(launch_line(4, 2), PHASES[2])
    with pytest.raises(LaunchError, match=r"must be --nproc_per_node=1, 4 or 8"):
        parse_launch(launch_line(64, 2))


def test_unknown_phase_is_one_line() -> None:
    with pytest.raises(ValueError, match="phases 1 or 2"):
        phase(3)
