"""A kit run whose step log gives step durations only says at train time that its charge is
a lower bound and that package/verify will refuse the log (issue 25.3), before the user
finds out at `trnf package`."""

from __future__ import annotations

from pathlib import Path

from trnfrontier.contract.budget import account_log
from trnfrontier.kit import logs, out_dir
from trnfrontier.kit.launch import LaunchOutcome
from trnfrontier.kit.train_kit import COMPLETED, KitOptions, KitRun, _judge, _Observed


def _judged(tmp_path: Path, lines: list[str]) -> KitRun:
    """The run's judgement over a real step log, charged as a kit run charges it (from its launch)."""
    step_log = tmp_path / "step_boundaries.jsonl"
    step_log.write_text("".join(line + "\n" for line in lines))
    accounting, how = account_log(step_log, None, launch=1000.0)
    assert accounting is not None, how
    checkpoint = tmp_path / "out" / "final.pt"
    seen = _Observed(LaunchOutcome(0), {}, logs.PrintedRun(), accounting, how, out_dir.OutDir(tmp_path / "out", out_dir.BY_TRNF),
                     out_dir.Found(checkpoint, False), {})
    run = KitRun(run_dir=tmp_path, summary={})
    assert _judge(run, seen, KitOptions(train_py=tmp_path / "train.py")) == (COMPLETED, None)
    return run


def test_a_log_of_durations_only_is_noted_as_a_lower_bound_that_package_will_refuse(tmp_path: Path) -> None:
    run = _judged(tmp_path, [f"step {i:05d} | loss 9.0 | dt: 930ms" for i in range(8)])
    assert run.problems == []  # the run itself is fine; only its proof of the budget is short
    [note] = run.notes
    assert note.startswith("the charge (")
    assert "is a lower bound: the step log gives each step's duration only (printed step lines (step, dt)" in note
    assert "`trnf package` and `trnf verify` will refuse this log" in note and "time.time()" in note


def test_a_log_of_end_times_has_no_such_note(tmp_path: Path) -> None:
    run = _judged(tmp_path, [f'{{"step": {i}, "time": {1001.0 + i}}}' for i in range(8)])
    assert run.notes == [] and run.problems == []
