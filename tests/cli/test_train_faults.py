"""Process faults of a live `trnf train`: a second writer is refused naming the first, and
`kill -9` of trnf's process group leaves no trainer running and no final/ written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.test_train_cli import TINY
from trnfrontier import processes
from trnfrontier.runtime import runlock
from trnfrontier.runtime.checkpoint_ref import latest_checkpoint
from trnfrontier.runtime.rundir import FINAL_DIR, LOCK_FILE, SUMMARY_FILE

REPO = Path(__file__).resolve().parents[2]
# Long enough that the run is still going when it is killed: the kill, not the budget, ends it.
LONG = [*TINY, "budget.seconds=600", "budget.competition=false", "runtime.device=cpu"]


def _wait_for(condition, what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _start_trnf(run: Path, nproc: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TRNF_PREPARE": str(REPO / "prepare.py")}
    command = [sys.executable, "-m", "trnfrontier", "train", "cpu_smoke", "--out", str(run), *LONG]
    if nproc > 1:
        command += ["--nproc", str(nproc), "runtime.threads=1"]
    # Its own session, so its process group is exactly trnf and what trnf puts in it.
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2], ids=["one process", "torchrun"])
def test_kill_9_of_trnf_leaves_nothing_running(sample_home: Path, tmp_path: Path, nproc: int) -> None:
    run = tmp_path / "run"
    trnf = _start_trnf(run, nproc)
    tree: set[processes.Proc] = set()
    try:
        _wait_for(lambda: latest_checkpoint(run) is not None or trnf.poll() is not None, "a checkpoint")
        assert trnf.poll() is None, trnf.stderr.read().decode()[-2000:] if trnf.stderr else ""
        tree = processes.descendants(trnf.pid)
        assert len(tree) >= nproc  # the trainer(s), and torchrun for nproc > 1

        # A second writer, while the first is alive, is refused naming it.
        second = subprocess.run(
            [sys.executable, "-m", "trnfrontier", "train", "--resume", str(run)],
            env={**os.environ, "TRNF_PREPARE": str(REPO / "prepare.py")},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode != 0 and "Traceback" not in second.stderr
        assert f"pid {trnf.pid}" in second.stderr and "being written by" in second.stderr

        os.killpg(trnf.pid, signal.SIGKILL)
        trnf.wait()
        _wait_for(lambda: not any(processes.is_alive(p) for p in tree), "the trainer to die", 30)
    finally:
        # Whatever the test's outcome, nothing it started outlives it (orphans included).
        processes.kill(tree | processes.descendants(trnf.pid))
    time.sleep(2)  # what an orphan would have done by now
    assert not (run / FINAL_DIR).exists() and not (run / SUMMARY_FILE).exists()
    # The lock is left behind, and stale: the next writer takes it over.
    assert (run / LOCK_FILE).exists()
    lock = runlock.acquire(run)
    assert lock.took_over and "no longer running" in lock.took_over
    lock.release()
    assert json.loads((latest_checkpoint(run) / "meta.json").read_text())["step"] >= 1
