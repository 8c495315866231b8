"""One writer per run directory: a live holder is named and refused, a dead one is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trnfrontier.runtime import runlock
from trnfrontier.runtime.rundir import LOCK_FILE

HOLDER = textwrap.dedent(
    """
    import sys, time
    from trnfrontier.runtime import runlock
    lock = runlock.acquire(sys.argv[1], command="holder")
    print("held", flush=True)
    time.sleep(120)
    """
)


def _hold(run_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_first(tmp_path: Path) -> None:
    holder = _hold(tmp_path)
    try:
        with pytest.raises(runlock.RunLockedError) as info:
            runlock.acquire(tmp_path)
        message = str(info.value)
        assert f"pid {holder.pid}" in message and os.uname().nodename in message
        assert "holder" in message and f"kill {holder.pid}" in message and "\n" not in message
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_writers_lock_is_taken_over_with_a_message(tmp_path: Path) -> None:
    holder = _hold(tmp_path)
    holder.send_signal(signal.SIGKILL)  # as `kill -9` leaves it: the file stays
    holder.wait()
    assert (tmp_path / LOCK_FILE).exists()
    lock = runlock.acquire(tmp_path)
    assert lock.took_over is not None and f"pid {holder.pid}" in lock.took_over
    assert json.loads((tmp_path / LOCK_FILE).read_text())["processes"][0]["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_the_launcher_hands_its_lock_to_the_trainer(tmp_path: Path) -> None:
    parent = runlock.acquire(tmp_path, command="trnf train")
    code = (
        "import sys; from trnfrontier.runtime import runlock; "
        "lock = runlock.acquire(sys.argv[1]); print(lock.owner); lock.release()"
    )
    env = {**os.environ, runlock.TOKEN_ENV: parent.token}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"  # joined, not owner
    # The child's release removed only its own pid: the launcher still holds the run.
    assert [p["pid"] for p in json.loads((tmp_path / LOCK_FILE).read_text())["processes"]] == [os.getpid()]
    with pytest.raises(runlock.RunLockedError):
        runlock.acquire(tmp_path, token="someone-else")
    parent.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_from_another_host_is_refused_with_the_way_out(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text(
        json.dumps({"token": "x", "host": "elsewhere", "processes": [{"pid": 1, "start": 1}]})
    )
    with pytest.raises(runlock.RunLockedError, match=f"elsewhere.*delete {tmp_path / LOCK_FILE}"):
        runlock.acquire(tmp_path)


def test_a_garbled_lock_file_is_stale(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text("not json")
    lock = runlock.acquire(tmp_path)
    assert lock.owner
    lock.release()


def test_live_writer_names_a_live_holder_and_ignores_a_dead_one(tmp_path: Path) -> None:
    assert runlock.live_writer(tmp_path) is None  # no lock at all
    holder = _hold(tmp_path)
    try:
        writer = runlock.live_writer(tmp_path)
        assert writer is not None and writer.pid == holder.pid and writer.same_host
        assert "(holder)" in writer.description and writer.how_to_stop(tmp_path) == f"kill {holder.pid}"
    finally:
        holder.kill()
        holder.wait()
    assert runlock.live_writer(tmp_path) is None  # stale: its process is gone
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "processes": [{"pid": 1}]}))
    writer = runlock.live_writer(tmp_path)
    assert writer is not None and not writer.same_host and str(tmp_path / LOCK_FILE) in writer.how_to_stop(tmp_path)
