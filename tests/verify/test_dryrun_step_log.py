"""verify --dry-run on a step log trnf cannot read says that, not that train.py never recorded a step (issue 25.2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trnfrontier.runtime.rundir import STEP_LOG_FILE
from trnfrontier.verify import dryrun


def test_an_unreadable_step_log_is_not_blamed_on_train_py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "archive"
    root.mkdir()
    (root / "train.py").write_text("print('trains')\n")
    work = tmp_path / "work"
    work.mkdir()

    def train(*args: object, **kwargs: object) -> dryrun.sandbox.Finished:
        """train.py as run: a checkpoint, and a step log it did write, in a shape trnf does not read."""
        (work / "run" / "out").mkdir(parents=True)
        (work / "run" / "out" / "final.pt").write_bytes(b"checkpoint")
        (work / "run" / STEP_LOG_FILE).write_text("boundary 0 at 12:00:01\nboundary 1 at 12:00:02\n")
        return dryrun.sandbox.Finished(0, "")

    monkeypatch.setattr(dryrun, "build_clean_env", lambda work, prepare: work / "venv" / "bin" / "python")
    monkeypatch.setattr(dryrun.sandbox, "run_confined", train)
    result = dryrun.dry_run(root, ["train.py"], work, nproc=1, lnc=2, prepare=None, steps=2, timeout=60)
    assert not result.passed
    assert result.reason.startswith(f"the step log could not be read: step log {work / 'run' / STEP_LOG_FILE} is in a form")
    assert "line 1 is neither" in result.reason and "never" not in result.reason
