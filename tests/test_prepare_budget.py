"""The step-boundary log and the organisers' budget clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def write_log(path: Path, start: float, boundaries: list[tuple[int, float]]) -> None:
    lines = [{"header": True, "start_time": start, "pid": 1}] + [{"step": s, "time": t} for s, t in boundaries]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_record_step_boundary_writes_a_header_then_steps(prepare_module, tmp_path, monkeypatch) -> None:
    log = tmp_path / "logs" / "steps.jsonl"
    monkeypatch.setenv("TRNF_STEP_LOG", str(log))
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    for step in (0, 1, 2):
        prepare_module.record_step_boundary(step)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records[0]["header"] is True and records[0]["start_time"] == prepare_module.PROCESS_START_TIME
    assert [r["step"] for r in records[1:]] == [0, 1, 2]
    times = [r["time"] for r in records[1:]]
    assert times == sorted(times) and times[0] >= prepare_module.PROCESS_START_TIME
    assert prepare_module.budget_accounting(log)["steps"] == 3


def test_only_rank_zero_records(prepare_module, tmp_path, monkeypatch) -> None:
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv("TRNF_STEP_LOG", str(log))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    prepare_module.record_step_boundary(1)
    assert not log.exists()


def test_accounting_excludes_startup_up_to_the_cap(prepare_module, tmp_path) -> None:
    log = tmp_path / "steps.jsonl"
    start = 1000.0
    boundaries = [(step, start + 40.0 + 2.0 * step) for step in range(100)]  # startup ends at index 4
    write_log(log, start, boundaries)
    result = prepare_module.budget_accounting(log)
    startup = boundaries[4][1] - start
    total = boundaries[-1][1] - start
    assert result["startup_seconds"] == pytest.approx(startup)
    assert result["charged_seconds"] == pytest.approx(total - startup)
    assert result["headroom_seconds"] == pytest.approx(prepare_module.TRAIN_TIME_BUDGET_SECONDS - (total - startup))
    assert result["over_budget"] is False and result["steps"] == 100

    capped = prepare_module.budget_accounting(log, cap=10.0, budget=total - 11.0)
    assert capped["excluded_seconds"] == 10.0
    assert capped["charged_seconds"] == pytest.approx(total - 10.0)
    assert capped["over_budget"] is True


def test_fewer_steps_than_excluded_is_all_startup(prepare_module, tmp_path) -> None:
    log = tmp_path / "steps.jsonl"
    write_log(log, 0.0, [(0, 100.0), (1, 150.0), (2, 1000.0)])
    result = prepare_module.budget_accounting(log)
    cap = prepare_module.TRAIN_STARTUP_ALLOWANCE_CAP_SECONDS
    assert result["startup_seconds"] == 1000.0
    assert result["excluded_seconds"] == cap and result["charged_seconds"] == pytest.approx(1000.0 - cap)


def test_accounting_reads_the_last_run_in_the_log(prepare_module, tmp_path) -> None:
    log = tmp_path / "steps.jsonl"
    write_log(log, 0.0, [(s, 10.0 * (s + 1)) for s in range(19)])
    older = log.read_text()
    write_log(log, 500.0, [(s, 500.0 + s + 1) for s in range(7)])
    log.write_text(older + log.read_text())
    result = prepare_module.budget_accounting(log)
    assert result["start_time"] == 500.0 and result["steps"] == 7
    assert result["charged_seconds"] == pytest.approx(7.0 - 5.0)


def test_bad_logs_are_clear_errors(prepare_module, tmp_path) -> None:
    with pytest.raises(prepare_module.PrepareError, match="no step log"):
        prepare_module.budget_accounting(tmp_path / "missing.jsonl")
    headerless = tmp_path / "headerless.jsonl"
    headerless.write_text('{"step": 1, "time": 1.0}\n')
    with pytest.raises(prepare_module.PrepareError, match="no header line"):
        prepare_module.budget_accounting(headerless)
