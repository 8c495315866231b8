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
        assert f"pid {trnf.pid}" in second.stderr and "still going, written by" in second.stderr

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


def _second_shell(*args: str) -> subprocess.CompletedProcess[str]:
    """`trnf ARGS` as a user types it in another terminal while the first run goes on."""
    return subprocess.run(
        [sys.executable, "-m", "trnfrontier", *args],
        env={**os.environ, "TRNF_PREPARE": str(REPO / "prepare.py")},
        capture_output=True, text=True, timeout=300,
    )


@pytest.mark.slow
def test_a_second_shell_meets_the_live_writer_before_its_first_checkpoint(sample_home: Path, tmp_path: Path) -> None:
    """The outside's case: `trnf train --resume DIR` while DIR's run starts said "no complete
    checkpoint"; every command that would misread a live run names its writer first."""
    run = tmp_path / "run"
    trnf = _start_trnf(run, 1)
    tree: set[processes.Proc] = set()
    try:
        _wait_for(lambda: (run / LOCK_FILE).exists() or trnf.poll() is not None, "the writer's lock")
        assert trnf.poll() is None and latest_checkpoint(run) is None
        for args in (["train", "--resume", str(run)], ["train", "cpu_smoke", *TINY, "--out", str(run)], ["package", str(run)]):
            second = _second_shell(*args)
            (line,) = [text for text in second.stderr.splitlines() if text.startswith("trnf:")]
            assert second.returncode != 0 and line.startswith("trnf: error:"), second.stderr
            assert f"pid {trnf.pid}" in line and f"(trnf train cpu_smoke --out {run}" in line, line
            assert f"kill {trnf.pid}" in line or "Choose another" in line
            assert "no complete checkpoint" not in line and "remove it" not in line
        tree = processes.descendants(trnf.pid)
    finally:
        os.killpg(trnf.pid, signal.SIGKILL)
        trnf.wait()
        processes.kill(tree | processes.descendants(trnf.pid))


HOLDER = (
    "import sys, time; from trnfrontier.runtime import runlock; "
    "runlock.acquire(sys.argv[1], command='trnf train cpu_smoke --out ' + sys.argv[1]); print('held', flush=True); time.sleep(120)"
)


@pytest.mark.parametrize("command", ["resume", "new run", "package"])
def test_every_command_that_would_misread_a_live_run_names_its_writer(
    command: str, sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.cli_run import run_cli

    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.json").write_text("{}")  # what a starting run has written so far
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        args = {"resume": ["train", "--resume", str(run)], "new run": ["train", "cpu_smoke", "--out", str(run)],
                "package": ["package", str(run)]}[command]
        code, out, err = run_cli(args, capsys)
    finally:
        holder.kill()
        holder.wait()
    assert code != 0 and out == "" and err.count("\n") == 1, err
    assert f"pid {holder.pid}" in err and f"(trnf train cpu_smoke --out {run})" in err
    assert "recipe.json" not in err and "summary.json" not in err  # not what the live run lacks


@pytest.mark.slow
def test_a_real_full_disk_at_the_final_checkpoint_is_one_line_with_the_traceback_in_the_log(
    sample_home: Path, tmp_path: Path
) -> None:
    """The outside's case: the run's folder on a small tmpfs, full when the final
    checkpoint is written. The console gets the one line (and the next step), not the
    worker's traceback around it; train.log keeps the traceback."""
    from tests.tmpfs import small_tmpfs, tmpfs_or_skip

    mount = tmp_path / "small"
    mount.mkdir()
    tmpfs_or_skip(mount)
    run = mount / "run"
    # No periodic checkpoint: the final one is the first write that does not fit.
    args = [*TINY, "budget.max_steps=2", "eval.final=false", "run.checkpoint_every_seconds=null"]
    command = [sys.executable, "-m", "trnfrontier", "train", "cpu_smoke", *args, "--out", str(run)]
    script = f'{" ".join(map(repr, command))}; rc=$?; cat {run}/train.log >&2; exit $rc'
    done = subprocess.run(
        small_tmpfs(mount, "2m", ["sh", "-c", script]), capture_output=True, text=True, timeout=900,
        env={**os.environ, "TRNF_PREPARE": str(REPO / "prepare.py")}, cwd=REPO,
    )
    console, _, log = done.stderr.partition("$ ")  # train.log starts with the command it ran
    assert done.returncode not in (0, 99), done.stderr
    assert "Traceback" not in console, console
    (line,) = [text for text in console.splitlines() if text.startswith("trnf: error:")]
    assert line.startswith(f"trnf: error: training stopped: disk full writing the final checkpoint {run / 'final'}: it needs about")
    assert f"(traceback in {run / 'train.log'})" in line and "once that is fixed, start it again with `trnf train cpu_smoke" in line
    assert "Traceback (most recent call last)" in log and log.rstrip().splitlines()[-1].startswith("error: disk full writing")


@pytest.mark.slow
def test_ctrl_c_writes_the_checkpoint_of_the_step_in_progress(sample_home: Path, tmp_path: Path) -> None:
    """The outside's case: Ctrl-C lost the steps since the last periodic checkpoint. Now
    the trainer finishes its step and checkpoints it; the resume repeats nothing."""
    run = tmp_path / "run"
    env = {**os.environ, "TRNF_PREPARE": str(REPO / "prepare.py")}
    args = [*LONG, "run.checkpoint_every_seconds=null"]  # no periodic checkpoint at all
    trnf = subprocess.Popen(
        [sys.executable, "-m", "trnfrontier", "train", "cpu_smoke", "--out", str(run), *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        log = run / "step_boundaries.jsonl"
        _wait_for(lambda: log.exists() and log.read_text().count('"step"') >= 3 or trnf.poll() is not None, "3 steps")
        assert trnf.poll() is None
        os.killpg(trnf.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
        _, err = trnf.communicate(timeout=300)
    finally:
        processes.kill(processes.descendants(trnf.pid) | ({p} if (p := processes.identify(trnf.pid)) else set()))
    assert trnf.returncode == 130, err
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None, err
    step = json.loads((checkpoint / "meta.json").read_text())["step"]
    assert f"training stopped at step {step}; its checkpoint checkpoints/{checkpoint.name} (step {step}) holds every step done" in err
    assert "Traceback" not in err
    summary = json.loads((run / SUMMARY_FILE).read_text())
    assert summary["status"] == "interrupted" and summary["last_good_checkpoint"] == str(checkpoint)
