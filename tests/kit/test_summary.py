"""Kit-run budget numbers: the organisers' accounting of the step log, and per-step charged seconds."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from trnfrontier.contract.budget import account_log
from trnfrontier.kit import summary
from trnfrontier.kit.logs import PrintedRun


def _step_log(path: Path, start: float, times: list[float], stale: bool = False) -> Path:
    lines = []
    if stale:  # an earlier process's segment: the accounting reads the last one only
        lines += [{"header": True, "start_time": 0.0, "pid": 1}, {"step": 1, "time": 50.0}]
    lines.append({"header": True, "start_time": start, "pid": 2})
    lines += [{"step": i, "time": t} for i, t in enumerate(times)]  # 0-based, as the kit records
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_charged_per_step_follows_the_organisers_rule(tmp_path: Path, prepare_module: ModuleType) -> None:
    # Startup (to step 5) takes 1000 s, more than the 900 s cap: 100 s of it is charged.
    log = _step_log(tmp_path / "steps.jsonl", 100.0, [400, 700, 900, 1000, 1100, 1110, 1120], stale=True)
    accounting, how = account_log(log, prepare_module)
    assert how == "prepare.budget_accounting"
    theirs = prepare_module.budget_accounting(str(log))
    assert {key: accounting[key] for key in theirs} == theirs
    assert accounting["start_source"] == "the log's header line" and accounting["start_time"] == 100.0
    charged = summary.charged_by_step(log, accounting)
    assert charged[0] == pytest.approx(0.0) and charged[3] == pytest.approx(0.0)
    assert charged[4] == pytest.approx(100.0)  # index 4 ends startup: the clock starts there
    assert charged[6] == pytest.approx(accounting["charged_seconds"]) == pytest.approx(120.0)
    assert accounting["steps"] == 7


def test_missing_or_broken_step_log_says_why(tmp_path: Path, prepare_module: ModuleType) -> None:
    accounting, why = account_log(tmp_path / "absent.jsonl", prepare_module)
    assert accounting is None and "never called prepare.record_step_boundary" in why
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "time": 3}\n')
    accounting, why = account_log(bad, prepare_module)
    assert accounting is None and why.startswith(f"step log {bad} is in a form trnf does not read (line 1 comes before")
    assert "never called" not in why  # the script did call it: trnf could not read what it wrote


def test_metrics_records_carry_charged_seconds(tmp_path: Path) -> None:
    printed = PrintedRun(records=[{"step": 1, "loss": 3.0}, {"step": 2, "loss": float("nan")}])
    assert summary.write_metrics(tmp_path / "metrics.jsonl", printed, {2: 1.5}) == 2
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "loss": 3.0}, {"step": 2, "loss": None, "charged_seconds": 1.5}]
    fields = summary.printed_fields(PrintedRun(records=[{"step": 3, "loss": 2.0, "mfu": 0.3}], params=10))
    assert fields["final_loss"] == 2.0 and fields["mfu"] == 0.3 and fields["params"] == 10
    assert fields["tokens_per_second"] is None and fields["reported_val_bpb"] is None
