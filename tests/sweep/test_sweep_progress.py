"""The sweep's counts line (running / done / stopped / failed / pending, best so far, time
left): the live view's, and `trnf sweep status DIR`'s for a sweep in flight or stopped.
No Ray: the sweep folder is written here as the driver writes it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.cli_run import run_cli
from trnfrontier.runtime import runlock
from trnfrontier.sweep import state as st
from trnfrontier.sweep.report import progress_line
from trnfrontier.sweep.spec import read_spec

DRIVER_STARTED = 1000.0


def _sweep(tmp_path: Path) -> tuple[st.SweepState, Path]:
    """Four trials: one completed under an earlier driver, one under this one (started at
    1000 s), one running, one not started yet."""
    folder = tmp_path / "sw"
    folder.mkdir()
    spec = {"name": "p", "recipe": "cpu_smoke", "space": {"optim.matrix_lr": {"grid": [0.01, 0.02, 0.03, 0.04]}}, "concurrency": 2}
    (folder / st.SPEC_FILE).write_text(yaml.safe_dump(spec), encoding="utf-8")
    sweep = st.new_state(folder, "p", spec)
    sweep.driver_started = DRIVER_STARTED
    sweep.resumes = 1
    for trial_id, lr, status, finished, val_bpb in (("t0", 0.01, st.COMPLETED, 100.0, 1.2), ("t1", 0.02, st.COMPLETED, 1100.0, 1.1),
                                                    ("t2", 0.03, st.RUNNING, None, None)):  # fmt: skip
        run_dir = folder / f"p-{trial_id}"
        run_dir.mkdir()
        if val_bpb is not None:
            (run_dir / "summary.json").write_text(json.dumps({"status": "completed", "val_bpb": val_bpb, "steps": 10}))
        sweep.trials[trial_id] = {"params": {"optim.matrix_lr": lr}, "run_dir": run_dir.name, "status": status,
                                  "started": (finished or 1150.0) - 50.0, "finished": finished}  # fmt: skip
    sweep.save()
    return sweep, folder


def test_the_time_left_is_this_drivers_pace_not_every_trial_ever_ended(tmp_path: Path) -> None:
    sweep, folder = _sweep(tmp_path)
    spec = read_spec(folder / st.SPEC_FILE)
    line = progress_line(st.load_state(folder), spec, alive=True, now=1200.0)
    # One trial ended in the 200 s since this driver started, two are left: 400 s. (Pooling
    # t0, which an earlier driver ran, would say half that.)
    assert line == "trials: 1 running, 2 done, 0 stopped, 0 failed, 1 pending; best val_bpb 1.1000 (t1); about 6.7 min left"
    sweep.driver_started = 1150.0  # nothing ended under this driver yet: no guess
    assert progress_line(sweep, spec, alive=True, now=1200.0).endswith("best val_bpb 1.1000 (t1)")


def test_sweep_status_shows_the_live_views_line(tmp_path: Path, capsys) -> None:
    _, folder = _sweep(tmp_path)
    code, out, err = run_cli(["sweep", "status", str(folder)], capsys)
    assert code == 0, err
    # No driver holds the folder: its running trial waits for --resume, and nothing is left to time.
    assert "trials: 0 running, 2 done, 0 stopped, 0 failed, 2 pending; best val_bpb 1.1000 (t1); no driver is running: " \
           f"continue with `trnf sweep --resume {folder}`" in out  # fmt: skip
    assert "interrupted" in out

    lock = runlock.acquire(folder, command="trnf sweep")  # a live driver
    try:
        code, out, err = run_cli(["sweep", "status", str(folder), "--json"], capsys)
    finally:
        lock.release()
    assert code == 0, err
    line = json.loads(out)["progress"]
    assert line.startswith("trials: 1 running, 2 done, 0 stopped, 0 failed, 1 pending; best val_bpb 1.1000 (t1); about ")
    assert line.endswith(" min left")
