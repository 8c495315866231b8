"""Launching a process tree, and ending all of it: the one helper every launch site uses.

``start`` launches a command in a session of its own (so its whole group can be signalled);
``run_tree`` runs one to completion with a time limit and returns its exit status and
output; ``stop_tree`` ends a launched process and everything it started. On a timeout,
Ctrl-C or SIGTERM to trnf the whole tree goes, never just the direct child.

Why not just ``killpg``: torchrun starts every worker with ``start_new_session=True``, so
the workers are *not* in torchrun's process group. Killing torchrun's group with SIGKILL
leaves the workers running, orphaned. So the launcher remembers every descendant it has
seen (walking ``/proc`` by parent pid while torchrun is alive, each with its start time so
that a recycled pid is never mistaken for one of ours) and, at the end, kills the process
group of each one that is still alive, then the process itself.

``start(die_with_parent=True)`` also ties the child to trnf's life: between fork and exec
it asks the kernel (``prctl(PR_SET_PDEATHSIG)``) to signal it when its parent dies, even
by ``kill -9``, since a child in a session of its own is out of reach of trnf's process
group. The signal follows the *thread* that started the child: launch from the main
thread. The trainer's own half of this is ``trnfrontier.train.lifeline``.

Linux only (``/proc``, ``prctl``); elsewhere only the launched process's own group is
reached, and nothing dies with its parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    """A process as identified by (pid, start time in clock ticks since boot)."""

    pid: int
    start: int


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of ``pid`` from /proc/PID/stat, or None when it is gone."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[19])


def identify(pid: int) -> Proc | None:
    stat = _stat(pid)
    return Proc(pid, stat[2]) if stat else None


def descendants(root: int) -> set[Proc]:
    """Every live descendant of ``root`` (not ``root`` itself), from one scan of /proc."""
    children: dict[int, list[Proc]] = {}
    try:
        entries = [int(name) for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return set()
    for pid in entries:
        stat = _stat(pid)
        if stat is not None and stat[0] != "Z":
            children.setdefault(stat[1], []).append(Proc(pid, stat[2]))
    found: set[Proc] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child.pid)
    return found


def is_alive(proc: Proc) -> bool:
    """True while ``proc`` (the same pid *and* start time) exists and is not a zombie."""
    stat = _stat(proc.pid)
    return stat is not None and stat[0] != "Z" and stat[2] == proc.start


def kill(procs: set[Proc], sig: int = signal.SIGKILL, wait: float = 10.0) -> None:
    """Signal each live process in ``procs`` and its process group; with SIGKILL, wait (at
    most ``wait`` seconds) until they are gone, since delivery is not instantaneous."""
    for proc in sorted(procs, key=lambda p: p.pid):
        if not is_alive(proc):
            continue
        try:
            pgid = os.getpgid(proc.pid)
            if pgid != os.getpgrp():  # never our own group (the trnf process itself)
                os.killpg(pgid, sig)
            os.kill(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait
    while sig == signal.SIGKILL and any(is_alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)


def stop_tree(proc: subprocess.Popen[bytes], seen: set[Proc] | None = None, grace: float = 10.0) -> None:
    """End a launched process and everything it started: SIGTERM its group (torchrun stops
    its workers cleanly), wait up to ``grace`` seconds, then SIGKILL every process seen in
    the tree (``seen`` plus a fresh scan), each with its own group, and reap ``proc``.

    A second Ctrl-C or SIGTERM while this runs is ignored: it would abandon the workers
    half-way."""
    with _signals_ignored():
        tree = set(seen or ()) | descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        me = identify(proc.pid)
        kill(tree | ({me} if me else set()))
        proc.wait()


def interrupt_and_wait(proc: subprocess.Popen[bytes], wait: float) -> bool:
    """Ask a launched tree to stop by itself: SIGINT to its group, as a terminal's Ctrl-C
    would send (torchrun hands it on to every worker), then wait up to ``wait`` seconds.
    True when it ended. A second Ctrl-C (or SIGTERM to trnf) ends the wait early; the
    caller then stops the tree (``stop_tree``)."""
    if proc.poll() is not None:
        return True
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except (ProcessLookupError, PermissionError):
        return proc.poll() is not None
    try:
        proc.wait(timeout=wait)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        return False
    return True


def _on_main_thread() -> bool:
    # Signal handlers can only be set from the main thread; elsewhere these are no-ops.
    return threading.current_thread() is threading.main_thread()


@contextmanager
def _signals_ignored() -> Iterator[None]:
    saved = [(sig, signal.signal(sig, signal.SIG_IGN)) for sig in (signal.SIGINT, signal.SIGTERM)] if _on_main_thread() else []
    try:
        yield
    finally:
        for sig, handler in saved:
            signal.signal(sig, handler)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While launched work runs, SIGTERM to trnf (`kill`, `timeout`, a cancelled CI job)
    raises KeyboardInterrupt like Ctrl-C, so the caller stops the tree; by default trnf
    would die at once and leave the workers, in sessions of their own, running."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _on_main_thread() else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_PR_SET_PDEATHSIG = 1


def _libc() -> Any:
    """The C library through ctypes (imported here: only launches that bind a child need it)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def set_parent_death_signal(sig: int = signal.SIGKILL, libc: Any = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits."""
    libc = libc or _libc()
    if libc is None:
        return False
    return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0


def parent_death_preexec(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``Popen(preexec_fn=...)`` that sets the parent-death signal in the child and
    exits at once if the parent already died between fork and this call."""
    parent = os.getpid()
    libc = _libc()  # loaded before the fork: no dlopen in the child

    def child() -> None:
        if libc is not None and set_parent_death_signal(sig, libc) and os.getppid() != parent:
            os._exit(1)

    return child


def start(
    cmd: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    die_with_parent: bool = False,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a new session (its own process group), so that ``stop_tree`` can
    reach it and what it starts without ever signalling trnf itself. ``die_with_parent``:
    the kernel sends it SIGTERM when trnf dies, even by SIGKILL (main thread only). SIGTERM, not SIGKILL: torchrun then stops its workers before it exits."""
    preexec = parent_death_preexec(signal.SIGTERM) if die_with_parent else None
    return subprocess.Popen(
        list(cmd), cwd=cwd, env=dict(env) if env is not None else None,
        stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True, preexec_fn=preexec,
        pass_fds=tuple(pass_fds),
    )


@dataclass(frozen=True)
class Finished:
    """How a ``run_tree`` command ended."""

    returncode: int | None  # None: still running at the timeout, so the tree was killed
    stdout: str  # its output (the last ``tail_bytes`` of it); stderr too when merged
    stderr: str  # "" when merged into stdout or passed through

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def _tail(handle: IO[bytes], limit: int | None) -> str:
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(max(0, size - limit) if limit is not None else 0)
    return handle.read().decode("utf-8", "replace")


POLL_SECONDS = 0.5


def _wait(proc: subprocess.Popen[bytes], timeout: float | None, poll: Callable[[], None] | None) -> int:
    """``proc.wait(timeout)``, calling ``poll`` between short waits (and once at the end)."""
    if poll is None:
        return proc.wait(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout or 0)
        try:
            code = proc.wait(timeout=POLL_SECONDS if left is None else min(POLL_SECONDS, left))
        except subprocess.TimeoutExpired:
            poll()
            continue
        poll()
        return code


def run_tree(
    cmd: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    merge_stderr: bool = False,
    stdout: IO[Any] | None = None,
    tail_bytes: int | None = None,
    grace: float = 0.5,
    poll: Callable[[], None] | None = None,
) -> Finished:
    """Run ``cmd`` to completion in a session of its own and return how it ended.

    Past ``timeout`` seconds the whole tree is killed and ``returncode`` is None; on
    Ctrl-C (or SIGTERM to trnf) the tree is killed and KeyboardInterrupt propagates.
    Either way, and after a normal exit, nothing it started is left running. Output is
    captured (stderr separately unless ``merge_stderr``) unless ``stdout`` is given, a
    stream that receives stdout as it comes (stderr then goes where trnf's goes).
    ``poll`` is called about every ``POLL_SECONDS`` while it runs, and once at the end
    (to relay the child's progress).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = start(
            cmd, cwd=cwd, env=env,
            stdout=stdout if stdout is not None else out,
            stderr=subprocess.STDOUT if merge_stderr else (None if stdout is not None else err),
        )
        try:
            with sigterm_as_interrupt():
                code: int | None = _wait(proc, timeout, poll)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            # Also after a normal exit: whatever it left behind in its group goes too.
            stop_tree(proc, grace=grace)
        return Finished(
            code,
            "" if stdout is not None else _tail(out, tail_bytes),
            "" if merge_stderr else _tail(err, tail_bytes),
        )
