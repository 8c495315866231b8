"""The launch runner and process-tree handling, on plain Python processes (no torchrun: fast).

The stand-in for torchrun starts its "worker" with ``start_new_session=True``, as torchrun
does, so killing the launcher's process group alone would orphan it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kit_fixtures import pid_alive

from trnfrontier import processes
from trnfrontier.kit import launch

LAUNCHER = """\
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", (
    "import os, subprocess, sys, time\\n"
    "helper = subprocess.Popen(['sleep', '300'])\\n"
    "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {helper.pid}')\\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\\n"
    "time.sleep(300)\\n"), sys.argv[1]], start_new_session=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print(f"launcher {os.getpid()} ready", flush=True)
time.sleep(float(sys.argv[2]))
print("launcher done", flush=True)
"""


def _plan(tmp_path: Path, linger: float) -> launch.LaunchPlan:
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    argv = [sys.executable, str(script), str(tmp_path / "pids"), str(linger)]
    return launch.LaunchPlan(argv, tmp_path, dict(os.environ), "test", tmp_path / "torchrun")


def _pids(tmp_path: Path) -> list[int]:
    return [int(p) for p in (tmp_path / "pids").read_text().split()]


def test_organisers_command() -> None:
    assert launch.organisers_command(4, 1) == "NEURON_LOGICAL_NC_CONFIG=1 torchrun --standalone --nproc_per_node=4 train.py"
    assert launch.organisers_command(1, 2, args=("--depth", "12", "a b")).endswith("train.py --depth 12 'a b'")


def test_torchrun_plan_is_the_organisers_command_plus_logging(tmp_path: Path) -> None:
    plan = launch.torchrun_plan(python="/py", script=tmp_path / "train.py", nproc=2, lnc=1, args=("--x", "1"),
                                cwd=tmp_path, env={"A": "b"}, log_dir=tmp_path / "logs", isolated=True)
    assert plan.argv[:4] == ["/py", "-I", "-m", "torch.distributed.run"]
    assert plan.argv[4:6] == ["--standalone", "--nproc_per_node=2"]
    assert plan.argv[-3:] == [str(tmp_path / "train.py"), "--x", "1"]
    assert plan.env["NEURON_LOGICAL_NC_CONFIG"] == "1" and plan.env["A"] == "b"
    assert plan.organisers == "NEURON_LOGICAL_NC_CONFIG=1 torchrun --standalone --nproc_per_node=2 train.py --x 1"


def test_timeout_kills_every_process_including_other_sessions(tmp_path: Path) -> None:
    lines: list[str] = []
    outcome = launch.run(_plan(tmp_path, 300), timeout=8, console_log=tmp_path / "console.log", on_line=lines.append)
    assert outcome.timed_out and outcome.exit_code is None
    worker, helper = _pids(tmp_path)
    assert {worker, helper} <= {p.pid for p in outcome.pids}
    assert not any(pid_alive(pid) for pid in (worker, helper))
    assert any("ready" in line for line in lines)
    assert "ready" in (tmp_path / "console.log").read_text()


def test_normal_exit_reports_the_code_and_removes_leftovers(tmp_path: Path) -> None:
    outcome = launch.run(_plan(tmp_path, 2), timeout=None, console_log=tmp_path / "console.log")
    assert outcome.exit_code == 0 and not outcome.timed_out
    assert "launcher done" in outcome.console
    assert not any(pid_alive(pid) for pid in _pids(tmp_path))


def test_descendants_and_identity(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '60']).wait()"])
    try:
        deadline = time.monotonic() + 60
        while len(processes.descendants(child.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = processes.descendants(os.getpid())
        me = processes.identify(child.pid)
        assert me is not None and me in found and processes.is_alive(me)
        assert len(processes.descendants(child.pid)) == 1
        processes.kill(found & ({me} | processes.descendants(child.pid)))
        child.wait(timeout=30)
        assert not processes.is_alive(me)
        # Same pid, another start time: never treated as ours.
        assert not processes.is_alive(processes.Proc(os.getpid(), 1))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
