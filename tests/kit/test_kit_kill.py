"""`kill -9` of trnf's process group during a kit run (`trnf train --train-py`, torchrun and
a team's own train.py, which knows nothing of trnf) leaves no process of the run alive:
torchrun gets SIGTERM when trnf dies and stops its ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kit_fixtures import pid_alive, write_train_py


@pytest.mark.slow
def test_kill_9_of_trnf_during_a_kit_run_stops_every_rank(sample_home: Path, tmp_path: Path) -> None:
    train_py = write_train_py(tmp_path / "team", "hang")
    command = [sys.executable, "-m", "trnfrontier", "train", "--train-py", str(train_py), "--nproc", "2",
               "--out", str(tmp_path / "run"), "--timeout", "600"]
    trnf = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    pid_files = [train_py.parent / "pids" / f"rank{rank}" for rank in (0, 1)]
    deadline = time.monotonic() + 600  # a bound for a stuck test, not a performance assertion
    while not all(p.is_file() for p in pid_files) and trnf.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(p) for f in pid_files if f.is_file() for p in f.read_text().split()]
    try:
        assert len(pids) == 4, trnf.stderr.read().decode()[-3000:] if trnf.poll() is not None and trnf.stderr else pids
        os.killpg(trnf.pid, signal.SIGKILL)
        trnf.wait()
        deadline = time.monotonic() + 60
        while [pid for pid in pids if pid_alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in pids if pid_alive(pid)]
    finally:
        for pid in pids:  # nothing this test started outlives it, whatever the outcome
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
