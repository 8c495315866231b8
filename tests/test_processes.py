"""Ending a launched process tree, including children that left its process group."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from trnfrontier import processes

# A parent that starts a child in a session of its own (as torchrun does with its workers),
# writes the child's pid, and hangs.
SPAWNER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""


def _wait_for_pid(path: Path) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError("the spawner never reported its child")


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_stop_tree_reaches_children_in_their_own_session(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    proc = subprocess.Popen([sys.executable, "-c", SPAWNER, str(marker)], start_new_session=True)
    child = _wait_for_pid(marker)
    assert _alive(child)
    processes.stop_tree(proc, grace=0.5)
    assert proc.returncode is not None
    assert not _alive(child), "a worker in its own session survived"


def test_verify_timeouts_leave_no_process(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    started = []

    def watch() -> None:
        started.append(_wait_for_pid(marker))

    import threading

    watcher = threading.Thread(target=watch)
    watcher.start()
    done = processes.run_tree([sys.executable, str(script), str(marker)], cwd=tmp_path, timeout=15)
    watcher.join()
    assert done.timed_out
    assert started and not _alive(started[0]), "verify's timeout left a worker running"


def test_run_tree_separates_the_streams_and_reports_the_exit_status(tmp_path: Path) -> None:
    script = "import sys; print('out line'); print('err line', file=sys.stderr); sys.exit(7)"
    done = processes.run_tree([sys.executable, "-c", script], cwd=tmp_path, timeout=60)
    assert (done.returncode, done.timed_out) == (7, False)
    assert done.stdout.strip() == "out line" and done.stderr.strip() == "err line"
    merged = processes.run_tree([sys.executable, "-c", script], timeout=60, merge_stderr=True, tail_bytes=9)
    assert merged.stderr == "" and merged.stdout.strip() in ("err line", "out line")


def test_run_tree_ends_what_a_finished_command_left_behind(tmp_path: Path) -> None:
    # The parent exits at once; its child (in the parent's process group) would run on.
    marker = tmp_path / "child.pid"
    script = (
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
    )
    done = processes.run_tree([sys.executable, "-c", script], timeout=60)
    assert done.returncode == 0
    child = int(marker.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "a child of a finished command was left running"


def test_run_tree_polls_while_the_command_runs_and_once_at_the_end(tmp_path: Path) -> None:
    calls = []
    done = processes.run_tree([sys.executable, "-c", "import time; time.sleep(1.2)"], poll=lambda: calls.append(1))
    assert done.returncode == 0 and len(calls) >= 2
    timed_out = processes.run_tree([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1.0, poll=lambda: None)
    assert timed_out.timed_out
