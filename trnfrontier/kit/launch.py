"""The organisers' launch command, run as they run it, with per-rank logs and a hard stop.

The organisers run ``NEURON_LOGICAL_NC_CONFIG=L torchrun --standalone --nproc_per_node=N
train.py``. trnf runs the same thing as ``python -m torch.distributed.run`` (torchrun's
own module, under the interpreter trnf was given, so no PATH lookup can pick another
torchrun) plus logging flags only: ``--log-dir``, ``--redirects 3`` (each rank's stdout
and stderr to its own file) and ``--tee 3`` (and to the console, prefixed ``[defaultR]:``,
which trnf streams to stderr as live progress and keeps as ``logs/console.log``).

torchrun runs in its own session. On timeout or Ctrl-C it gets SIGTERM (so it can stop its
workers itself), then, after a grace period, everything it ever started gets SIGKILL,
found through ``processes`` (torchrun puts each worker in a session of its own).
"""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trnfrontier import processes
from trnfrontier.contract.launch import launch_line

TERM_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.5


def organisers_command(nproc: int, lnc: int, script: str = "train.py", args: tuple[str, ...] = ()) -> str:
    """The launch line as the organisers write it (what launch.txt holds)."""
    line = launch_line(nproc, lnc, script)
    return f"{line} {shlex.join(args)}" if args else line


@dataclass(frozen=True)
class LaunchPlan:
    """What is executed, where, with which environment (the full child environment)."""

    argv: list[str]
    cwd: Path
    env: dict[str, str]
    organisers: str
    log_dir: Path


def torchrun_plan(
    *, python: str, script: Path, nproc: int, lnc: int, args: tuple[str, ...], cwd: Path,
    env: dict[str, str], log_dir: Path, isolated: bool = False,
) -> LaunchPlan:
    """The plan for ``torchrun --standalone --nproc_per_node=N script ARGS`` (``isolated``: ``python -I``)."""
    argv = [python, *(["-I"] if isolated else []), "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", "--log-dir", str(log_dir), "--redirects", "3", "--tee", "3",
            str(script), *args]
    env = dict(env)
    env["NEURON_LOGICAL_NC_CONFIG"] = str(lnc)
    # Workers write to files; unbuffered output makes the live view and a crash's last
    # lines complete. It changes no behaviour of the script.
    env["PYTHONUNBUFFERED"] = "1"
    return LaunchPlan(argv, cwd, env, organisers_command(nproc, lnc, script.name, args), log_dir)


@dataclass
class LaunchOutcome:
    exit_code: int | None  # None when trnf stopped it (timeout, Ctrl-C)
    timed_out: bool = False
    interrupted: bool = False
    seconds: float = 0.0
    console: str = ""  # everything torchrun and the ranks printed (prefixed)
    pids: set[processes.Proc] = field(default_factory=set)


def run(plan: LaunchPlan, *, timeout: float | None, console_log: Path,
        on_line: Callable[[str], None] | None = None) -> LaunchOutcome:
    """Run ``plan``; stream its output to ``on_line`` and ``console_log``; stop it at ``timeout``.

    Ctrl-C stops the whole tree too and is reported as ``interrupted`` (the caller decides
    what to do with it). No process started here survives this call.
    """
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    console_log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    chunks: list[str] = []
    with open(console_log, "w", encoding="utf-8") as log:
        proc = processes.start(
            plan.argv, cwd=plan.cwd, env=plan.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, die_with_parent=True
        )

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace")
                chunks.append(line)
                log.write(line)
                log.flush()
                if on_line is not None:
                    on_line(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        outcome = LaunchOutcome(exit_code=None)
        seen: set[processes.Proc] = set()
        try:
            with processes.sigterm_as_interrupt():
                while proc.poll() is None:
                    seen |= processes.descendants(proc.pid)
                    if timeout is not None and time.monotonic() - started > timeout:
                        outcome.timed_out = True
                        processes.stop_tree(proc, seen, grace=TERM_GRACE_SECONDS)
                        break
                    time.sleep(_POLL_SECONDS)
        except KeyboardInterrupt:
            outcome.interrupted = True
            processes.stop_tree(proc, seen, grace=TERM_GRACE_SECONDS)
        # Anything the script left behind after torchrun exited (a forked helper) goes too.
        processes.kill(seen)
        reader.join(timeout=10)
        code = proc.wait()
        if not (outcome.timed_out or outcome.interrupted):
            outcome.exit_code = code
    outcome.seconds = time.monotonic() - started
    outcome.console = "".join(chunks)
    outcome.pids = seen
    return outcome

