"""The boundary around archive code: bubblewrap (``bwrap``), never a home-made jail.

Every process that runs code from an archive (the model server behind the contract probe
and ``--rerun-eval``, ``--dry-run``, kit dry runs) is started through :func:`wrap`, which
puts it inside ``bwrap`` with:

- ``--unshare-all``: its own network namespace (only a loopback no one else is on: nothing
  on the host, 127.0.0.1 included, is reachable), PID, IPC, UTS and user namespaces;
- ``--cap-drop ALL`` (bwrap keeps capabilities when started by root unless told not to),
  ``--new-session`` (no terminal injection), ``--die-with-parent``;
- a filesystem of read-only binds of only what the run needs (``/usr``, the Python
  installation and its site-packages, the files the caller names) plus one writable
  directory, the run's own scratch directory (also ``HOME`` and ``TMPDIR``) and a small
  ``/tmp`` tmpfs; ``/etc`` is a generated passwd/group/hosts, not the host's;
- ``--clearenv`` and only the variables the caller lists (never the caller's secrets);
- CPU-time, address-space, file-size and open-file limits, set by a three-line shim
  (``resource.setrlimit`` then ``execv``) inside the sandbox, plus the caller's wall limit;
- limits on the whole process tree (``treelimits``): memory (tmpfs pages included) and
  processes plus threads, by a cgroup where verify may make one, else by a watchdog; and
  size-limited tmpfs for ``/scratch``, ``/tmp`` and ``/dev/shm``. ``limits_line()`` says
  which of these hold on this machine; ``Started.breach()`` which one ended a run.

When the command ends, bwrap's init exits and the kernel kills everything left in the
PID namespace, so no daemon outlives the run; on a timeout the caller kills bwrap's
process tree and ``--die-with-parent`` takes the namespace down with it.

Where bwrap is missing or cannot create namespaces (a container without user
namespaces), :func:`available` says why; verify then refuses to execute archive code
unless the user passes ``--allow-unsandboxed``, in which case :func:`wrap` still scrubs
the environment and applies the limits, but offers no isolation.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trnfrontier.untrusted.tailpipe import TailPipe
from trnfrontier.untrusted.treelimits import DEFAULT_TASKS, TreeGuard, TreeLimits, tree_limits_how

BWRAP_ENV = "TRNF_BWRAP"  # an explicit bwrap binary (tests point it at a missing path)
_GIB = 1 << 30
# Size caps of the sandbox's own filesystems (tmpfs: memory, gone with the run).
SCRATCH_INSIDE = "/scratch"
SCRATCH_BYTES = 1 << 30
TMP_BYTES = 512 << 20
SHM_BYTES = 256 << 20
# Inside the sandbox, before the real command: apply the limits, then become the command.
_SHIM = (
    "import json,os,resource,sys\n"
    "for k,v in json.loads(sys.argv[1]).items():\n"
    " r=getattr(resource,k);h=resource.getrlimit(r)[1];v=v if h==resource.RLIM_INFINITY else min(v,h)\n"
    " resource.setrlimit(r,(v,v))\n"
    "os.execv(sys.argv[2],sys.argv[2:])\n"
)
# Host paths a Python run needs besides the interpreter (merged-/usr symlinks are recreated as symlinks).
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
# The CPU topology (thread pools size themselves from it). Not /sys/fs/cgroup: the tree limits are
# joined and watched from outside (treelimits), nothing inside reads them, and through it two
# sandboxes would see one another's cgroups (memory, pids) and the host's whole hierarchy.
_SYS_DIRS = ("/sys/devices/system/cpu",)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-Linux
        return 16 * _GIB


MEMORY_ENV = "TRNF_SANDBOX_MEMORY_MIB"  # the memory limit of each sandbox's process tree, when set


def tree_memory_default() -> int:
    """``$TRNF_SANDBOX_MEMORY_MIB`` MiB when set, else three eighths of the machine's memory (at least 4 GiB)."""
    given = os.environ.get(MEMORY_ENV, "")
    if given.isdigit() and int(given) > 0:
        return int(given) << 20
    return max(4 * _GIB, _physical_memory() * 3 // 8)


@dataclass(frozen=True)
class Limits:
    """Per-process limits inside the sandbox (the wall limit is the caller's timeout).

    Address space rather than resident memory because that is what ``setrlimit`` can
    bound without cgroups; torch reserves more than it touches, so the default is
    generous: three quarters of the machine's memory, at least 4 GiB.
    """

    wall_seconds: float
    memory_bytes: int = field(default_factory=lambda: max(4 * _GIB, _physical_memory() * 3 // 4))
    file_bytes: int = 4 * _GIB  # per file: a real checkpoint is well under; a disk-filling loop stops here
    open_files: int = 4096
    # The whole tree (treelimits.py). --rerun-eval runs two sandboxes at once, so each gets three
    # eighths of the machine's memory (its tmpfs pages included), at least 4 GiB.
    tree_memory_bytes: int = field(default_factory=lambda: tree_memory_default())
    tasks: int = DEFAULT_TASKS

    def tree(self) -> TreeLimits:
        return TreeLimits(self.tree_memory_bytes, self.tasks)

    def rlimits(self) -> dict[str, int]:
        cpus = os.cpu_count() or 1
        return {
            "RLIMIT_AS": int(self.memory_bytes),
            "RLIMIT_CPU": int(self.wall_seconds * cpus) + 5,  # a backstop: the wall limit ends a run first
            "RLIMIT_FSIZE": int(self.file_bytes),
            "RLIMIT_NOFILE": int(self.open_files),
            "RLIMIT_CORE": 0,
        }


@dataclass(frozen=True)
class Jail:
    """What one sandboxed run may see.

    ``scratch``: the writable home (HOME, TMPDIR, by default the working directory): a host
    directory bound at its own path, or None for a private, size-limited tmpfs at
    ``SCRATCH_INSIDE`` that nothing on the host can see (nothing is ever read back from it).
    ``writable``: more host directories bound writable; ``read_only``: files and directories
    bound read-only at their own paths; ``placed``: (host path, path inside) pairs bound
    read-only at a fixed path, so that every run sees the same paths whatever the host's.
    ``env`` is the whole environment."""

    scratch: Path | None
    env: dict[str, str]
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    cwd: Path | str | None = None
    placed: tuple[tuple[Path, str], ...] = ()
    scratch_bytes: int = SCRATCH_BYTES

    @property
    def home(self) -> str:
        return str(self.scratch) if self.scratch is not None else SCRATCH_INSIDE

    @property
    def workdir(self) -> str:
        return str(self.cwd) if self.cwd is not None else self.home


@dataclass(frozen=True)
class Availability:
    ok: bool
    detail: str  # "bubblewrap 0.8.0 (...)" or why there is no sandbox


def bwrap_path() -> str | None:
    explicit = os.environ.get(BWRAP_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("bwrap")


_FLAGS = ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL")
MIN_VERSION = (0, 8)  # --size (a bounded tmpfs) and --disable-userns


def _version(text: str) -> tuple[int, ...]:
    digits = text.split()[-1] if text.split() else ""
    try:
        return tuple(int(part) for part in digits.split(".")[:2])
    except ValueError:
        return ()


@functools.lru_cache(maxsize=4)
def _probe(binary: str) -> Availability:
    """Whether ``binary`` can actually create the namespaces (containers often forbid it)."""
    try:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        if _version(version) and _version(version) < MIN_VERSION:
            return Availability(False, f"{version} at {binary} is too old: verify needs bubblewrap {'.'.join(map(str, MIN_VERSION))} "
                                       "or later (bounded tmpfs, no nested user namespaces)")
        trial = subprocess.run(
            [binary, *_FLAGS, *_system_binds(), "--size", str(1 << 20), "--tmpfs", "/tmp", "--", "/bin/true"],
            capture_output=True, text=True, timeout=20, env={"PATH": "/usr/bin:/bin"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Availability(False, f"{binary} does not run ({exc})")
    if trial.returncode != 0:
        why = (trial.stderr.strip().splitlines() or [f"exit {trial.returncode}"])[-1]
        return Availability(False, f"{binary} cannot create namespaces here ({why[:200]}); user namespaces may be disabled")
    return Availability(True, f"{version or 'bubblewrap'} at {binary}: no network, read-only filesystem but its temp dir, scrubbed environment, own PID namespace, limits")


def available() -> Availability:
    """Whether archive code can be sandboxed on this machine, and the one line that says so."""
    binary = bwrap_path()
    if binary is None:
        where = f"{BWRAP_ENV}={os.environ[BWRAP_ENV]}" if os.environ.get(BWRAP_ENV) else "PATH"
        return Availability(False, f"bubblewrap (bwrap) not found on {where}; install it (apt-get install bubblewrap) or see docs/ci.md")
    return _probe(binary)


def _system_binds() -> list[str]:
    args: list[str] = []
    for name in _SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
    return args


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def python_paths() -> tuple[Path, ...]:
    """The interpreter and the import path a run needs, read-only: the installation
    (``sys.base_prefix``), the venv, and the site-packages directories on sys.path (a
    base venv an overlay venv points at). Never other sys.path entries: ``python -m``
    puts the working directory there, which may be the user's home."""
    repo = _repo_root()
    found: list[Path] = []
    prefixes = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix]
    site_dirs = [e for e in sys.path if e and Path(e).name in ("site-packages", "dist-packages")]
    for entry in [*prefixes, *site_dirs]:
        for path in {Path(entry), Path(entry).resolve()}:
            if path.exists() and path not in (repo, Path("/"), Path.home()):
                found.append(path)
    found.append(Path(sys.executable).resolve().parent)
    return tuple(dict.fromkeys(found))


def _etc_contents(home: str) -> dict[str, str]:
    """A private /etc: who the user is and that localhost is the loopback (gloo and torchrun
    resolve it); nothing of the host's /etc beyond the loader's files."""
    uid, gid = os.getuid(), os.getgid()
    return {"passwd": f"sandbox:x:{uid}:{gid}:sandbox:{home}:/bin/sh\n", "group": f"sandbox:x:{gid}:\n",
            "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n", "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n"}


def _etc_binds(jail: Jail) -> tuple[list[str], list[int]]:
    """bwrap arguments (and the descriptors they read) that give the sandbox its /etc files.

    With a tmpfs scratch the contents travel through memfds (``--ro-bind-data``): verify
    writes no file anywhere. With a host scratch (a dry run) they are created under it,
    exclusively and without following links, so a scratch that some earlier run could have
    prepared is refused instead of written through."""
    contents = _etc_contents(jail.home)
    args: list[str] = []
    if jail.scratch is None:
        fds: list[int] = []
        for name, text in contents.items():
            fd = os.memfd_create(f"etc-{name}")  # close-on-exec: only bwrap gets it (pass_fds)
            os.write(fd, text.encode())
            os.lseek(fd, 0, os.SEEK_SET)
            fds.append(fd)
            args += ["--ro-bind-data", str(fd), f"/etc/{name}"]
        return args, fds
    etc = jail.scratch / ".sandbox-etc"
    os.mkdir(etc, 0o755)  # FileExistsError on a reused scratch: never write through what is there
    for name, text in contents.items():
        fd = os.open(etc / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    return args, []


def _binds(jail: Jail) -> tuple[list[str], list[int]]:
    args = _system_binds()
    for name in _ETC_FILES:
        if os.path.lexists(name):
            args += ["--ro-bind-try", name, name]
    etc_args, fds = _etc_binds(jail)
    args += etc_args
    for name in _SYS_DIRS:
        args += ["--ro-bind-try", name, name]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
             "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
    for path in [*python_paths(), *jail.read_only]:
        args += ["--ro-bind", str(path), str(path)]
    for source, inside in jail.placed:
        args += ["--ro-bind", str(source), inside]
    if jail.scratch is None:
        args += ["--size", str(jail.scratch_bytes), "--tmpfs", SCRATCH_INSIDE]
    for path in ([jail.scratch] if jail.scratch is not None else []) + list(jail.writable):
        args += ["--bind", str(path), str(path)]
    # The root is bwrap's own tmpfs (mount points); read-only too, so only the binds above write.
    return [*args, "--remount-ro", "/"], fds


def _shim(argv: list[str], limits: Limits) -> list[str]:
    return [str(Path(sys.executable)), "-I", "-S", "-c", _SHIM, json.dumps(limits.rlimits()), *argv]


@dataclass(frozen=True)
class Wrapped:
    """A confined command: its argv, the environment to start it with, and descriptors it must inherit
    (bwrap reads them while it sets up; close them once the process has started)."""

    argv: list[str]
    env: dict[str, str]
    fds: tuple[int, ...] = ()

    def close_fds(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def wrap(argv: list[str], jail: Jail, limits: Limits, *, sandboxed: bool = True) -> Wrapped:
    """The command line and the environment that run ``argv`` confined by ``jail`` and ``limits``.

    ``argv[0]`` must be an absolute path. With ``sandboxed=False`` (``--allow-unsandboxed``
    on a machine without bwrap) the command still gets the scrubbed environment and the
    limits, in the scratch directory (which must then be a host directory), but nothing
    stops it from reaching the host.
    """
    env = dict(jail.env)
    env.setdefault("HOME", jail.home)
    env.setdefault("TMPDIR", jail.home)
    env.setdefault("PATH", "/usr/bin:/bin")
    inner = _shim(argv, limits)
    if not sandboxed:
        if jail.scratch is None or jail.placed:
            raise RuntimeError("an unsandboxed run needs a host scratch directory and host paths")
        return Wrapped(inner, env)
    binary = bwrap_path()
    if binary is None:
        raise RuntimeError("bubblewrap is not available")
    binds, fds = _binds(jail)
    outer = [binary, *_FLAGS, "--hostname", "sandbox", *binds, "--chdir", jail.workdir, "--clearenv"]
    for key, value in sorted(env.items()):
        outer += ["--setenv", key, value]
    return Wrapped([*outer, "--", *inner], {"PATH": "/usr/bin:/bin"}, tuple(fds))


def host_cwd(jail: Jail, sandboxed: bool) -> str:
    """Where to start bwrap (or, unsandboxed, the command itself): a directory that exists on the host."""
    if not sandboxed:
        return jail.workdir
    return str(jail.scratch) if jail.scratch is not None else "/"


@dataclass
class Started:
    """A confined process and the guard of its tree's limits."""

    proc: subprocess.Popen[bytes]
    guard: TreeGuard

    def breach(self) -> str:
        """The tree limit the run ran into ('' when none)."""
        return self.guard.breach()

    def stop(self, grace: float = 0.5) -> None:
        """End the whole tree (and its cgroup)."""
        from trnfrontier import processes

        processes.stop_tree(self.proc, grace=grace)
        self.guard.close()


def popen(argv: list[str], jail: Jail, limits: Limits, *, sandboxed: bool, pass_fds: Iterable[int] = (),
          stdout: int | IO[Any] = subprocess.DEVNULL) -> Started:
    """Start ``argv`` confined, in its own session and (where possible) its own cgroup; ``Started.stop``
    ends the whole tree."""
    from trnfrontier import processes

    command = wrap(argv, jail, limits, sandboxed=sandboxed)
    guard = TreeGuard.create(limits.tree())
    try:
        proc = processes.start([*guard.prefix(), *command.argv], cwd=host_cwd(jail, sandboxed), env=command.env, stdout=stdout,
                               stderr=subprocess.STDOUT, pass_fds=(*pass_fds, *command.fds))
    except BaseException:
        guard.close()
        raise
    finally:
        command.close_fds()
    guard.watch(proc.pid, lambda: processes.stop_tree(proc, grace=0.1))
    return Started(proc, guard)


@dataclass(frozen=True)
class Finished:
    """How a confined run ended: its exit code (None: killed at the wall limit), its output's
    tail, and the tree limit it ran into ('' when none)."""

    code: int | None
    output: str
    breach: str = ""


def run_confined(argv: list[str], jail: Jail, *, timeout: float, sandboxed: bool, limits: Limits | None = None,
                 tail_bytes: int = 4000) -> Finished:
    """Run ``argv`` confined; kill its whole tree at ``timeout``. Its output is kept in memory
    (the last ``tail_bytes``), never in a file it could reach."""
    from trnfrontier import processes

    tail = TailPipe(tail_bytes)
    try:
        started = popen(argv, jail, limits or Limits(wall_seconds=timeout), sandboxed=sandboxed, stdout=tail.write_fd)
    finally:
        tail.started()
    try:
        with processes.sigterm_as_interrupt():
            code: int | None = started.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        breach = started.breach()
        # Also after a normal exit: whatever it left behind in its namespace goes too.
        started.stop()
    tail.join()
    return Finished(code, tail.text(), breach)


def limits_line(limits: Limits | None = None) -> str:
    """What bounds a sandboxed run on this machine, in one line for the report."""
    limits = limits or Limits(wall_seconds=0)
    return (f"per sandbox: {tree_limits_how(limits.tree())}; tmpfs /scratch {SCRATCH_BYTES >> 20} MiB, /tmp {TMP_BYTES >> 20} MiB, "
            f"/dev/shm {SHM_BYTES >> 20} MiB; per process: {limits.memory_bytes >> 30} GiB address space, "
            f"{limits.file_bytes >> 30} GiB a file")
