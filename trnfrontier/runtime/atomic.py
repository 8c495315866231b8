"""Durable, all-or-nothing writes of files and whole directories.

Every file goes to a temporary name in its own directory, is fsynced and then
``os.replace``d, and the directory is fsynced; a directory is assembled under a temporary
name and renamed into place. A kill at any moment leaves either the old complete
version or the new complete one, never a torn one under a real name. Temporary names
start with ``.tmp-`` (and a directory being replaced is moved aside as ``.old-``), so a
later writer can recognise and clear what a killed one left (``TEMP_PREFIXES``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

TEMP_PREFIXES = (".tmp-", ".old-")


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
) -> Path:
    """Create directory ``target`` holding ``files`` (name -> writer), atomically.

    The files are written under ``.tmp-<name>.<pid>`` and the directory renamed into place.
    ``before_rename(tmp)`` may add files that describe the others (a manifest), so they
    appear together. An existing ``target`` is first moved aside and removed only once
    the new one is in.
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
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
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
