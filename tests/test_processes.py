"""Ending a launched process tree, including children that left its process group."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from trnfrontier import processes
from trnfrontier.verify.probe_process import run_in_group

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
    code, _ = run_in_group([sys.executable, str(script), str(marker)], cwd=tmp_path, env=None, timeout=15)
    watcher.join()
    assert code is None  # timed out
    assert started and not _alive(started[0]), "verify's timeout left a worker running"
