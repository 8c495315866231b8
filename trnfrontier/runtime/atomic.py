"""Durable, all-or-nothing writes of files and whole directories.

Every file goes to a temporary name in its own directory, is fsynced and then
``os.replace``d, and the directory is fsynced; a directory is assembled under a temporary
name and renamed into place. A kill at any moment leaves either the old complete
version or the new complete one, never a torn one under a real name. Temporary names
start with ``.tmp-`` (and a directory being replaced is moved aside as ``.old-``), so a
later writer can recognise and clear what a killed one left (``TEMP_PREFIXES``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

TEMP_PREFIXES = (".tmp-", ".old-")
# What a full disk (or a used-up quota) looks like to a write.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int | None:
    """Free space on the file system holding ``path`` (its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _mb(count: int | None) -> str:
    return "an unknown amount" if count is None else f"{count / 1e6:,.1f} MB"


class DiskFullError(OSError):
    """No space left while writing ``target``; the message says how much it needs and how
    much is free, and that nothing was half-written (the write was atomic)."""

    def __init__(self, target: Path, needed: int | None, what: str = "", advice: str = "") -> None:
        self.target, self.needed, self.free = Path(target), needed, free_bytes(Path(target))
        label = f"{what} {target}" if what else str(target)
        self.message = (
            f"disk full writing {label}: it needs about {_mb(needed)} and {_mb(self.free)} is free there; "
            f"nothing was half-written{'; ' + advice if advice else ''}"
        )
        super().__init__(errno.ENOSPC, self.message)

    def __str__(self) -> str:
        return self.message


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable (no-op where directories can't be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write ``path`` through ``write(handle)`` and fsync it (not atomic by itself)."""
    with open(path, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write ``path`` through ``write(handle)`` into a temporary file beside it, fsync,
    rename over ``path`` and fsync the directory. On any failure ``path`` is untouched."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}.{os.getpid()}")
    try:
        _write_file(tmp, write)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """``atomic_write`` of a byte string."""
    atomic_write(path, lambda handle: handle.write(data))


def json_bytes(document: Any) -> bytes:
    """The one JSON layout of every file the runtime writes (indented, sorted keys, final newline)."""
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")


def atomic_write_json(path: Path, document: Any) -> None:
    atomic_write_bytes(path, json_bytes(document))


def write_directory(
    target: Path,
    files: Mapping[str, Callable[[IO[bytes]], object]],
    before_rename: Callable[[Path], None] | None = None,
    *,
    expected_bytes: int | None = None,
    what: str = "",
) -> Path:
    """Create directory ``target`` holding ``files`` (name -> writer), atomically.

    The files are written under ``.tmp-<name>.<pid>`` and the directory renamed into place.
    ``before_rename(tmp)`` may add files that describe the others (a manifest), so they
    appear together. An existing ``target`` is first moved aside and removed only once
    the new one is in. A full disk raises ``DiskFullError`` (``expected_bytes``: the size
    it names; ``what``: what the target is, for the message) once the partial copy is gone.
    """
    target = Path(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".tmp-{target.name}.{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        for name, write in files.items():
            _write_file(tmp / name, write)
        if before_rename is not None:
            before_rename(tmp)
        fsync_dir(tmp)
        old = None
        if target.exists():
            old = parent / f".old-{target.name}.{os.getpid()}"
            if old.exists():
                shutil.rmtree(old)
            os.replace(target, old)
        os.replace(tmp, target)
        fsync_dir(parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc) and not isinstance(exc, DiskFullError):
            raise DiskFullError(target, expected_bytes, what) from None
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def remove_leftovers(directory: Path) -> None:
    """Delete what killed writers left in ``directory`` (names starting ``TEMP_PREFIXES``).

    Only safe where no other writer is at work in ``directory`` at the same time."""
    for child in directory.iterdir():
        if child.name.startswith(TEMP_PREFIXES):
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
