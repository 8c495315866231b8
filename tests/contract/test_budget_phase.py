"""contract/budget.py: a step log charged under a phase's rules (its budget seconds and its
startup rules from contract/phases.py), whoever's prepare.py is at hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType

import pytest

from trnfrontier.contract.budget import account_log
from trnfrontier.contract.phases import PHASES


def _step_log(path: Path) -> Path:
    # Startup (to step index 4) takes 1,000 s, 100 s over the 900 s cap; then 20 s of steps.
    times = [400, 700, 900, 1000, 1100, 1110, 1120]
    lines = [{"header": True, "start_time": 100.0, "pid": 2}, *({"step": i, "time": t} for i, t in enumerate(times))]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_phase_2_holds_the_same_charge_to_14400_s(tmp_path: Path, prepare_module: ModuleType) -> None:
    log = _step_log(tmp_path / "steps.jsonl")
    one, how_one = account_log(log, prepare_module)
    two, how_two = account_log(log, prepare_module, PHASES[2])
    assert one is not None and two is not None
    # Phase 2 assumes Phase 1's startup rules: the prepare.py's own arithmetic charges it.
    assert how_one == how_two == "prepare.budget_accounting"
    assert two["charged_seconds"] == one["charged_seconds"] == pytest.approx(120.0)
    assert (one["budget_seconds"], two["budget_seconds"]) == (1800, 14_400)
    assert two["headroom_seconds"] == pytest.approx(14_400 - 120.0) and two["over_budget"] is False


def test_a_phase_with_its_own_startup_rules_is_charged_by_them(tmp_path: Path, prepare_module: ModuleType) -> None:
    log = _step_log(tmp_path / "steps.jsonl")
    # As if the organisers published Phase 2's startup rules: 2 uncharged steps, a 500 s cap.
    rules = dataclasses.replace(PHASES[2], startup_steps_excluded=2, startup_allowance_cap_seconds=500.0)
    accounting, how = account_log(log, prepare_module, rules)
    assert accounting is not None
    assert how == "the documented formula under Phase 2's startup rules"
    # Startup ends at step index 1 (600 s after the start), capped at 500 s: 1,020 - 500 charged.
    assert accounting["startup_seconds"] == pytest.approx(600.0) and accounting["excluded_seconds"] == pytest.approx(500.0)
    assert accounting["charged_seconds"] == pytest.approx(520.0) and accounting["budget_seconds"] == 14_400
    assert accounting["start_source"] == "the log's header line"  # how the log was read is kept
