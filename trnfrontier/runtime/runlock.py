"""One writer per run directory: ``writer.lock`` records who writes it (pids, host, start).

Two trainers in one run directory interleave ``train.log``, put a second header in the
middle of the step log and cut ``metrics.jsonl`` short, so a second writer is refused,
naming the first. A lock whose processes are all gone on this host (a crash, ``kill -9``)
is stale and taken over, with a message saying so. A lock from another host cannot be
checked from here and is refused with the way out (delete the file once that run is gone).

``trnf train`` takes the lock before it touches the directory and hands it to the trainer
it launches (``TOKEN_ENV``); the trainer adds its own pid, so the lock stays live as long
as either is. A trainer started any other way (a packaged train.py) takes it itself.

Every read-modify-write of the lock file happens under ``fcntl.flock`` of that file, so
two writers starting at the same moment cannot both win. A process is identified by pid
*and* start time (``/proc``), so a recycled pid never keeps a dead lock alive.
Runtime layer: standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from trnfrontier.runtime.rundir import LOCK_FILE

TOKEN_ENV = "TRNF_RUN_LOCK_TOKEN"
# How much of the writer's command line the lock keeps (enough to recognise the run).
_COMMAND_CHARS = 300


class RunLockedError(RuntimeError):
    """Another live writer holds the run directory (one line naming it and what to do)."""


def _lock_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (Linux), or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def _lock_me() -> dict[str, Any]:
    return {"pid": os.getpid(), "start": _lock_start_time(os.getpid())}


def _lock_alive(process: dict[str, Any]) -> bool:
    pid = process.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    start = _lock_start_time(pid)
    if start is not None or Path("/proc/self/stat").exists():
        return start is not None and start == process.get("start", start)
    try:  # no /proc: the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _shorten(command: str, limit: int = _COMMAND_CHARS) -> str:
    """``command`` cut at a word boundary, with an ellipsis, when longer than ``limit``."""
    if len(command) <= limit:
        return command
    return command[: limit - 1].rsplit(" ", 1)[0] + " …"


def _lock_describe(holder: dict[str, Any]) -> str:
    pids = ", ".join(str(p.get("pid")) for p in holder.get("processes", []))
    since = holder.get("started", "?")
    command = holder.get("command")
    return f"pid {pids} on {holder.get('host', '?')} since {since}" + (f" ({command})" if command else "")


class RunLock:
    """The lock of one run directory, held by this process until ``release``."""

    def __init__(self, run_dir: Path, token: str, owner: bool, took_over: str | None) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.token = token
        self.owner = owner  # False: joined a lock its launcher took (only our pid goes on release)
        self.took_over = took_over  # the message to show when a stale lock was replaced

    def release(self) -> None:
        """Remove our pid; the owner removes the file. Never touches a lock someone else holds."""
        try:
            with _LockedFile(self.path, create=False) as handle:
                holder = _lock_read(handle)
                if holder.get("token") != self.token:
                    return
                if self.owner:
                    self.path.unlink(missing_ok=True)
                    return
                me = os.getpid()
                holder["processes"] = [p for p in holder.get("processes", []) if p.get("pid") != me]
                _lock_write(handle, holder)
        except FileNotFoundError:
            pass


class _LockedFile:
    """``with _LockedFile(path) as handle``: the lock file open and flock-ed exclusively."""

    def __init__(self, path: Path, create: bool = True) -> None:
        self.path, self.create = path, create

    def __enter__(self) -> Any:
        flags = os.O_RDWR | (os.O_CREAT if self.create else 0)
        while True:
            self.fd = os.open(self.path, flags, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            # The owner removes the file on release: a lock won on a removed file is no lock.
            try:
                if os.fstat(self.fd).st_ino == os.stat(self.path).st_ino:
                    return self.fd
            except FileNotFoundError:
                if not self.create:
                    os.close(self.fd)
                    raise
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _lock_read(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    try:
        data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _lock_write(fd: int, document: dict[str, Any]) -> None:
    raw = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, raw)
    os.fsync(fd)


class Writer(NamedTuple):
    """The live writer of a run directory, as its lock records it."""

    description: str  # "pid 123, 456 on HOST since T (COMMAND)"
    pid: int | None  # the first live process (the launcher: stopping it stops the run)
    same_host: bool

    def how_to_stop(self, run_dir: Path) -> str:
        """How to end it from here: ``kill PID``, or (another host) what to delete once it is gone."""
        if not self.same_host or self.pid is None:
            return f"once that run is gone, delete {Path(run_dir) / LOCK_FILE}"
        return f"kill {self.pid}"


def live_writer(run_dir: Path) -> Writer | None:
    """Who is writing ``run_dir`` now, or None when nobody is (no lock, or a stale one). A
    lock from another host counts as live (it cannot be checked from here). Reads only: a
    command that would misread a live run (``--resume``, a second start, packaging) asks
    this first, so it names the writer instead of what the half-written run lacks."""
    path = Path(run_dir) / LOCK_FILE
    try:
        with _LockedFile(path, create=False) as handle:
            holder = _lock_read(handle)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    if not holder:
        return None
    if holder.get("host") != os.uname().nodename:
        return Writer(_lock_describe(holder), None, same_host=False)
    live = [p for p in holder.get("processes", []) if _lock_alive(p)]
    if not live:
        return None
    return Writer(_lock_describe({**holder, "processes": live}), int(live[0]["pid"]), same_host=True)


def acquire(run_dir: Path, *, command: str | None = None, token: str | None = None) -> RunLock:
    """Take (or, with the launcher's ``token``, join) the lock of ``run_dir``.

    Raises RunLockedError when another live writer holds it. ``token`` defaults to
    ``$TRNF_RUN_LOCK_TOKEN`` (set by `trnf train` for the trainer it launches)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    host = os.uname().nodename
    path = run_dir / LOCK_FILE
    with _LockedFile(path) as handle:
        holder = _lock_read(handle)
        took_over = None
        if holder:
            if token is not None and holder.get("token") == token:
                holder["processes"] = [*holder.get("processes", []), _lock_me()]
                _lock_write(handle, holder)
                return RunLock(run_dir, token, owner=False, took_over=None)
            if holder.get("host") != host:
                raise RunLockedError(
                    f"{run_dir} is being written by {_lock_describe(holder)}; a second writer would interleave its "
                    f"logs and checkpoints. That host cannot be checked from here: once that run is gone, delete {path}"
                )
            live = [p for p in holder.get("processes", []) if _lock_alive(p)]
            if live:
                raise RunLockedError(
                    f"{run_dir} is being written by {_lock_describe(holder)}; a second writer would interleave its "
                    f"logs and checkpoints: wait for it to finish, or stop it (kill {live[0]['pid']})"
                )
            took_over = f"taking over the lock of {run_dir}: {_lock_describe(holder)} is no longer running"
        token = token or uuid.uuid4().hex
        document = {
            "token": token,
            "host": host,
            "processes": [_lock_me()],
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": _shorten(command or " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])),
        }
        _lock_write(handle, document)
    return RunLock(run_dir, token, owner=True, took_over=took_over)
