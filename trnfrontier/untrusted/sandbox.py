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
  (``resource.setrlimit`` then ``execv``) inside the sandbox, plus the caller's wall limit.

When the command ends, bwrap's init exits and the kernel kills everything left in the
PID namespace, so no daemon outlives the run; on a timeout the caller kills bwrap's
process tree and ``--die-with-parent`` takes the namespace down with it.

Where bwrap is missing or cannot create namespaces (a container without user
namespaces), :func:`available` says why; verify then refuses to execute archive code
unless the user passes ``--allow-unsandboxed``, in which case :func:`wrap` still scrubs
the environment and applies the limits, but offers no isolation.
"""

from __future__ import annotations

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

BWRAP_ENV = "TRNF_BWRAP"  # an explicit bwrap binary (tests point it at a missing path)
_GIB = 1 << 30
_TMPFS_BYTES = 512 << 20
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
_SYS_DIRS = ("/sys/devices/system/cpu", "/sys/fs/cgroup")


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-Linux
        return 16 * _GIB


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
    """What one sandboxed run may see: ``scratch`` (writable; HOME, TMPDIR and by default
    the working directory), ``writable`` (more writable directories), ``read_only``
    (files and directories bound read-only at their own paths) and the whole environment."""

    scratch: Path
    env: dict[str, str]
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    cwd: Path | None = None


@dataclass(frozen=True)
class Availability:
    ok: bool
    detail: str  # "bubblewrap 0.8.0 (...)" or why there is no sandbox


def bwrap_path() -> str | None:
    explicit = os.environ.get(BWRAP_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=4)
def _probe(binary: str) -> Availability:
    """Whether ``binary`` can actually create the namespaces (containers often forbid it)."""
    try:
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        trial = subprocess.run(
            [binary, "--unshare-all", "--die-with-parent", "--cap-drop", "ALL", *_system_binds(), "--", "/bin/true"],
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


def _etc_files(scratch: Path) -> Path:
    """A private /etc: who the user is and that localhost is the loopback (gloo and
    torchrun resolve it); nothing of the host's /etc beyond the loader's files."""
    etc = scratch / ".sandbox-etc"
    etc.mkdir(parents=True, exist_ok=True)
    uid, gid = os.getuid(), os.getgid()
    (etc / "passwd").write_text(f"sandbox:x:{uid}:{gid}:sandbox:{scratch}:/bin/sh\n")
    (etc / "group").write_text(f"sandbox:x:{gid}:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")
    (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files\n")
    return etc


def _binds(jail: Jail) -> list[str]:
    args = _system_binds()
    for name in _ETC_FILES:
        if os.path.lexists(name):
            args += ["--ro-bind-try", name, name]
    etc = _etc_files(jail.scratch)
    for name in ("passwd", "group", "hosts", "nsswitch.conf"):
        args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    for name in _SYS_DIRS:
        args += ["--ro-bind-try", name, name]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(_TMPFS_BYTES), "--tmpfs", "/tmp"]
    for path in [*python_paths(), *jail.read_only]:
        args += ["--ro-bind", str(path), str(path)]
    for path in (jail.scratch, *jail.writable):
        args += ["--bind", str(path), str(path)]
    # The root is bwrap's own tmpfs (mount points); read-only too, so only the binds above write.
    return [*args, "--remount-ro", "/"]


def _shim(argv: list[str], limits: Limits) -> list[str]:
    return [str(Path(sys.executable)), "-I", "-S", "-c", _SHIM, json.dumps(limits.rlimits()), *argv]


def wrap(argv: list[str], jail: Jail, limits: Limits, *, sandboxed: bool = True) -> tuple[list[str], dict[str, str]]:
    """The command line and the environment that run ``argv`` confined by ``jail`` and ``limits``.

    ``argv[0]`` must be an absolute path. With ``sandboxed=False`` (``--allow-unsandboxed``
    on a machine without bwrap) the command still gets the scrubbed environment and the
    limits, in the scratch directory, but nothing stops it from reaching the host.
    """
    env = dict(jail.env)
    env.setdefault("HOME", str(jail.scratch))
    env.setdefault("TMPDIR", str(jail.scratch))
    env.setdefault("PATH", "/usr/bin:/bin")
    cwd = jail.cwd or jail.scratch
    inner = _shim(argv, limits)
    if not sandboxed:
        return inner, env
    binary = bwrap_path()
    if binary is None:
        raise RuntimeError("bubblewrap is not available")
    outer = [binary, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
             "--hostname", "sandbox", *_binds(jail), "--chdir", str(cwd), "--clearenv"]
    for key, value in sorted(env.items()):
        outer += ["--setenv", key, value]
    return [*outer, "--", *inner], {"PATH": "/usr/bin:/bin"}


def popen(argv: list[str], jail: Jail, limits: Limits, *, sandboxed: bool, pass_fds: Iterable[int] = (),
          stdout: int | IO[Any] = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """Start ``argv`` confined, in its own session (``processes.stop_tree`` ends the whole tree)."""
    from trnfrontier import processes

    command, env = wrap(argv, jail, limits, sandboxed=sandboxed)
    return processes.start(command, cwd=jail.cwd or jail.scratch, env=env, stdout=stdout, stderr=subprocess.STDOUT,
                           pass_fds=tuple(pass_fds))


def run(argv: list[str], jail: Jail, *, timeout: float, sandboxed: bool, limits: Limits | None = None) -> tuple[int | None, str]:
    """Run ``argv`` confined; kill its whole tree at ``timeout``. (exit code or None on timeout, output tail)."""
    from trnfrontier import processes

    command, env = wrap(argv, jail, limits or Limits(wall_seconds=timeout), sandboxed=sandboxed)
    done = processes.run_tree(command, cwd=jail.cwd or jail.scratch, env=env, timeout=timeout, merge_stderr=True, tail_bytes=4000)
    return done.returncode, done.stdout
