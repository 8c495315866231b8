"""Limits on a sandboxed process tree as a whole: memory and tasks (processes and threads).

Per-process rlimits (``sandbox.Limits``) cannot bound a tree: a hundred processes under a
4 GiB address-space limit each hold 400 GiB, and RLIMIT_NPROC does not apply to root (the
sandbox's processes are root's when verify runs as root, as in many CI containers). So:

- a **cgroup** where this machine lets verify make one: v2 (a writable, delegated subtree of
  verify's own cgroup with the memory and pids controllers) or v1 (writable ``memory`` and
  ``pids`` hierarchies, as in a container that runs as root). The sandbox's first process
  joins it before it execs bwrap (``prefix``), so every process the archive starts is in it;
  ``memory.max`` / ``memory.limit_in_bytes`` and ``pids.max`` are the limits, and the
  kernel's own counters (``oom_kill``, ``max`` events) say afterwards which one was hit;
- otherwise a **watchdog** thread that sums the tree's resident memory and counts its tasks
  a few times a second and kills the tree past either limit (a burst between two looks can
  go over for a moment: the per-process rlimits still hold then).

``tree_limits_how`` is the line the report quotes; ``TreeGuard.breach()`` names the limit that ended a run.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_POLL_SECONDS = 0.25
DEFAULT_TASKS = 1024


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


@dataclass(frozen=True)
class TreeLimits:
    memory_bytes: int
    tasks: int = DEFAULT_TASKS

    def describe(self) -> str:
        return f"{_gib(self.memory_bytes)} of memory, {self.tasks} processes and threads"


def _own_cgroup(controller: str) -> Path | None:
    """This process's cgroup directory for ``controller`` (v1), or its v2 cgroup (controller '')."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, names, path = parts
        if controller and controller in names.split(","):
            base = _CGROUP_ROOT / controller
        elif not controller and parts[0] == "0" and names == "":
            base = _CGROUP_ROOT if (_CGROUP_ROOT / "cgroup.controllers").exists() else _CGROUP_ROOT / "unified"
        else:
            continue
        found = base / path.lstrip("/")
        return found if found.is_dir() else None
    return None


def _try_v2(limits: TreeLimits, name: str) -> tuple[list[Path], str] | None:
    own = _own_cgroup("")
    if own is None:
        return None
    try:
        enabled = (own / "cgroup.subtree_control").read_text().split()
        if not {"memory", "pids"} <= set(enabled):
            return None
        group = own / name
        group.mkdir()
    except OSError:
        return None
    try:
        (group / "memory.max").write_text(str(limits.memory_bytes))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
        (group / "pids.max").write_text(str(limits.tasks))
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return [group], "cgroup v2"


def _try_v1(limits: TreeLimits, name: str) -> tuple[list[Path], str] | None:
    made: list[Path] = []
    try:
        for controller in ("memory", "pids"):
            own = _own_cgroup(controller)
            if own is None:
                raise OSError(f"no {controller} cgroup")
            group = own / name
            group.mkdir()
            made.append(group)
        made[0].joinpath("memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        made[1].joinpath("pids.max").write_text(str(limits.tasks))
    except OSError:
        for group in made:
            with contextlib.suppress(OSError):
                group.rmdir()
        return None
    return made, "cgroup v1"


@dataclass
class TreeGuard:
    """The limits of one sandboxed run, enforced by a cgroup or, failing that, a watchdog."""

    limits: TreeLimits
    groups: list[Path] = field(default_factory=list)
    kind: str = "watchdog"
    _breach: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def create(cls, limits: TreeLimits) -> TreeGuard:
        name = f"trnf-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        made = _try_v2(limits, name) or _try_v1(limits, name)
        if made is None:
            return cls(limits)
        return cls(limits, made[0], made[1])

    def prefix(self) -> list[str]:
        """What to run before bwrap: join the cgroup(s), then exec the rest of the command line."""
        if not self.groups:
            return []
        script = 'while [ "$1" != "--" ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *[str(g / "cgroup.procs") for g in self.groups], "--"]

    def watch(self, pid: int, kill: Callable[[], None]) -> None:
        """Without a cgroup: watch the tree under ``pid`` and call ``kill()`` past a limit."""
        if self.groups:
            return
        self._thread = threading.Thread(target=self._watch, args=(pid, kill), daemon=True)
        self._thread.start()

    def _watch(self, pid: int, kill: Callable[[], None]) -> None:
        from trnfrontier import processes

        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(_POLL_SECONDS):
            tree = processes.descendants(pid) | ({p} if (p := processes.identify(pid)) else set())
            if not tree:
                return
            tasks, memory = 0, 0
            for proc in tree:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    tasks += len(os.listdir(f"/proc/{proc.pid}/task"))
                    memory += int(Path(f"/proc/{proc.pid}/statm").read_text().split()[1]) * page
            if tasks > self.limits.tasks:
                self._breach = f"the process/thread limit ({self.limits.tasks}; watchdog)"
            elif memory > self.limits.memory_bytes:
                self._breach = f"the memory limit ({_gib(self.limits.memory_bytes)}; watchdog)"
            if self._breach:
                kill()
                return

    def breach(self) -> str:
        """Which limit the tree ran into ('' when none): the cgroup's own counters, or what the watchdog saw."""
        if self._breach:
            return self._breach
        for group in self.groups:
            for name, key, what in (("memory.events", "oom_kill", f"the memory limit ({_gib(self.limits.memory_bytes)})"),
                                    ("memory.oom_control", "oom_kill", f"the memory limit ({_gib(self.limits.memory_bytes)})"),
                                    ("pids.events", "max", f"the process/thread limit ({self.limits.tasks})")):
                counted = _counter(group / name, key)
                if counted:
                    return f"{what}; {self.kind}"
        return ""

    def close(self) -> None:
        """Stop watching; kill whatever is left in the cgroup and remove it."""
        self._stop.set()
        for group in self.groups:
            for _ in range(50):
                try:
                    pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, 9)
                time.sleep(0.02)
            with contextlib.suppress(OSError):
                group.rmdir()


def _counter(path: Path, key: str) -> int:
    try:
        text = path.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key and parts[1].isdigit():
            return int(parts[1])
    return 0


_PROBED: dict[str, str] = {}


def tree_limits_how(limits: TreeLimits) -> str:
    """How a sandbox's tree limits are enforced on this machine (one cgroup made and removed to find out, once)."""
    if "how" not in _PROBED:
        guard = TreeGuard.create(limits)
        _PROBED["how"] = guard.kind if guard.groups else ""
        guard.close()
    kind = _PROBED["how"]
    if kind:
        return f"{kind}, {limits.describe()} for the whole process tree"
    return f"a watchdog (no cgroup verify may create here), {limits.describe()} for the whole process tree"
