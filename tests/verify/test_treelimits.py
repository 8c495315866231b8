"""Limits on a sandboxed process tree as a whole (memory, processes and threads) and on its tmpfs: each breach named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trnfrontier.untrusted import sandbox, treelimits

needs_bwrap = pytest.mark.skipif(not sandbox.available().ok, reason=f"no usable bubblewrap here: {sandbox.available().detail}")

# Each holds what it took for a few seconds, so that the watchdog (which looks a few times a second)
# sees it too; a cgroup refuses it as it is taken.
MEMORY = "import time\nx = bytearray(900 << 20)\nx[::4096] = b'1' * len(x[::4096])\ntime.sleep(5)\nprint('survived')\n"


def _threads(hold: float) -> str:
    return ("import threading, time\nts = []\ntry:\n    for _ in range(400):\n        ts.append(threading.Thread(target=time.sleep, args=(8,), daemon=True))\n"
            f"        ts[-1].start()\n    print('started', len(ts))\nexcept RuntimeError as e:\n    print('refused', len(ts))\ntime.sleep({hold})\nprint('survived')\n")


def _run(code: str, limits: sandbox.Limits) -> sandbox.Finished:
    jail = sandbox.Jail(scratch=None, env={})
    return sandbox.run_confined([sys.executable, "-I", "-S", "-c", code], jail, timeout=60, sandboxed=True, limits=limits)


@pytest.fixture(params=["cgroup", "watchdog"])
def mechanism(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each limit is tested with a cgroup (where this machine lets verify make one) and with the watchdog."""
    if request.param == "watchdog":
        monkeypatch.setattr(treelimits, "_try_v2", lambda limits, name: None)
        monkeypatch.setattr(treelimits, "_try_v1", lambda limits, name: None)
    elif treelimits.TreeGuard.create(treelimits.TreeLimits(1 << 30)).groups == []:
        pytest.skip("no cgroup verify may create on this machine (the watchdog case covers it)")
    return str(request.param)


@needs_bwrap
def test_the_task_limit_holds_and_is_named(mechanism: str) -> None:
    done = _run(_threads(5 if mechanism == "watchdog" else 0), sandbox.Limits(wall_seconds=60, tasks=100))
    assert "process/thread limit (100" in done.breach, (done.breach, done.output[-300:])
    # A cgroup refuses the 101st task as it starts; the watchdog stops the tree once it looks.
    assert "started 400" not in done.output if mechanism == "cgroup" else "survived" not in done.output


@needs_bwrap
def test_the_memory_limit_holds_and_is_named(mechanism: str) -> None:
    done = _run(MEMORY, sandbox.Limits(wall_seconds=60, tree_memory_bytes=400 << 20))
    assert "memory limit (0.4 GiB" in done.breach, (done.breach, done.output[-300:])
    assert "survived" not in done.output


@needs_bwrap
def test_a_run_within_its_limits_breaches_nothing(mechanism: str) -> None:
    done = _run("print('fine')", sandbox.Limits(wall_seconds=60, tasks=100, tree_memory_bytes=1 << 30))
    assert done.code == 0 and done.breach == "" and "fine" in done.output


@needs_bwrap
@pytest.mark.parametrize(("path", "cap"), [("/dev/shm", sandbox.SHM_BYTES), ("/tmp", sandbox.TMP_BYTES)])
def test_the_sandboxs_own_filesystems_are_size_limited(path: str, cap: int) -> None:
    code = (f"import os\nn = 0\ntry:\n    with open({path + '/fill'!r}, 'wb') as f:\n        while True:\n"
            "            f.write(b'\\0' * (1 << 20)); f.flush(); n += 1\nexcept OSError as e:\n    print('stopped at', n, 'MiB', e.errno)\n")
    done = _run(code, sandbox.Limits(wall_seconds=60))
    assert f"stopped at {cap >> 20} MiB 28" in done.output or f"stopped at {(cap >> 20) - 1} MiB 28" in done.output, done.output[-300:]


def test_the_cgroups_are_removed_after_the_run(tmp_path: Path) -> None:
    guard = treelimits.TreeGuard.create(treelimits.TreeLimits(1 << 30))
    made = list(guard.groups)
    guard.close()
    assert all(not group.exists() for group in made)


def test_the_report_says_how_the_tree_is_limited() -> None:
    line = sandbox.limits_line()
    assert ("cgroup" in line or "watchdog" in line) and "processes and threads" in line and "/dev/shm 256 MiB" in line
