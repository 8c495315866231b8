"""Reading and removing what a sandbox wrote, on the host, without trusting any of it.

A sandboxed run (a dry run's train.py, say) can leave anything in the directories it
could write: a symlink where verify expects its step log (pointing at ``/proc/self/environ``,
a credentials file, ``/dev/zero``), a FIFO that blocks the first reader forever, a file of
many gigabytes, a single line of a gigabyte, directories nested ten thousand deep, files
without permissions. Every host-side access to such a tree goes through this module:

- ``read_capped``: opened component by component from a trusted directory, never following
  a symlink (``O_NOFOLLOW`` on every component), never blocking (``O_NONBLOCK``), only a
  regular file, only up to a stated number of bytes; anything else is ``UnsafeFile`` naming
  the path relative to the tree and why;
- ``find_files``: a walk that never follows a link, with a depth and an entry limit;
- ``remove_tree``: removal without recursion or path-length limits (one directory descriptor
  at a time), restoring permissions where the tree took them away;
- ``private_dir``: a temporary directory that ``remove_tree`` removes on every path out.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
MAX_DEPTH = 32
MAX_ENTRIES = 20_000
_OPEN_DIRS = 64  # descriptors held while removing a deep tree


class UnsafeFile(Exception):
    """A file in a sandbox-written tree that verify will not read; the message says which and why."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _open_dir_chain(root: Path, parts: tuple[str, ...], rel: str) -> int:
    """A descriptor of ``root/parts...``, each component opened without following a link."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise UnsafeFile(f"{rel}: not a plain relative path")
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                raise UnsafeFile(f"{rel}: {part!r} is not a plain directory (a link, or missing)") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(root: Path, rel: str, cap: int) -> bytes:
    """The bytes of the regular file ``root/rel``, at most ``cap`` of them, or ``UnsafeFile``.

    ``root`` is trusted (verify made it); everything under it is not. FileNotFoundError when
    the file is simply absent, so callers can tell "missing" from "refused"."""
    parts = tuple(Path(rel).parts)
    if not parts or Path(rel).is_absolute():
        raise UnsafeFile(f"{rel}: not a plain relative path")
    dir_fd = _open_dir_chain(root, parts[:-1], rel)
    try:
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            raise
        except OSError as exc:  # ELOOP: the last component is a symlink
            kind = "a symbolic link" if exc.errno == errno.ELOOP else os.strerror(exc.errno or 0)
            raise UnsafeFile(f"{rel} is {kind}; verify reads only regular files the run wrote") from None
    finally:
        os.close(dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{rel} is {_kind(info.st_mode)}; verify reads only regular files the run wrote")
        if info.st_size > cap:
            raise UnsafeFile(f"{rel} is {info.st_size:,} bytes, over the {cap:,}-byte limit for it")
        chunks, left = [], cap + 1
        while left and (block := os.read(fd, min(left, 1 << 20))):
            chunks.append(block)
            left -= len(block)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise UnsafeFile(f"{rel} grew past the {cap:,}-byte limit while it was read")
    return data


def find_files(root: Path, *, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> list[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every regular file under ``root``, links never followed;
    ``UnsafeFile`` when the tree is deeper than ``max_depth`` or holds more than ``max_entries``."""
    found: list[tuple[str, os.stat_result]] = []
    todo: list[tuple[Path, str, int]] = [(root, "", 0)]
    seen = 0
    while todo:
        path, rel, depth = todo.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > max_entries:
                raise UnsafeFile(f"the run left more than {max_entries:,} files and directories")
            name = f"{rel}/{entry.name}" if rel else entry.name
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 > max_depth:
                    raise UnsafeFile(f"the run left directories nested deeper than {max_depth} levels ({name[:80]}...)")
                todo.append((Path(entry.path), name, depth + 1))
            elif stat.S_ISREG(info.st_mode):
                found.append((name, info))
    return sorted(found)


def _subdirs_and_unlink(fd: int) -> list[str]:
    """Unlink every non-directory in the directory ``fd``; return its subdirectories."""
    subdirs: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    return subdirs


def _enter(parent: int, name: str) -> int:
    """Open subdirectory ``name`` of ``parent`` for removal, first giving ourselves access to it."""
    with contextlib.suppress(OSError):
        os.chmod(name, 0o700, dir_fd=parent)  # a directory, not a link: scandir said so
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


def remove_tree(path: Path) -> None:
    """Remove ``path`` and everything under it: no recursion, no path longer than one name,
    no link followed, permissions restored where needed. Absent: nothing to do."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(path)
        return
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    fd = os.open(path, _DIR_FLAGS)
    # [descriptor (-1 once closed to save descriptors), subdirectories left, own name in the parent]
    stack: list[list] = [[fd, _subdirs_and_unlink(fd), ""]]
    while True:
        top = stack[-1]
        if top[1]:
            name = top[1].pop()
            try:
                child = _enter(top[0], name)
            except FileNotFoundError:
                continue
            if len(stack) >= _OPEN_DIRS:
                os.close(top[0])
                top[0] = -1
            stack.append([child, _subdirs_and_unlink(child), name])
            continue
        fd, _, name = stack.pop()
        if not stack:
            os.close(fd)
            break
        parent = stack[-1]
        if parent[0] == -1:  # closed on the way down: reopen it from below (no path is ever built)
            parent[0] = os.open("..", _DIR_FLAGS, dir_fd=fd)
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=parent[0])
    os.rmdir(path)


@contextlib.contextmanager
def private_dir(prefix: str) -> Iterator[Path]:
    """A fresh temporary directory, removed with ``remove_tree`` however the block ends."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        remove_tree(path)
