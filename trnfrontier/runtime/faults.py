"""Faults a user can act on, as one line: which path, what the system said, what to do.

Two callers. ``trnf`` catches an ``OSError`` that escapes a command at its error boundary
and prints ``describe(exc)`` instead of a traceback. The trainer (``fault_line``) tells
an expected fault (a full disk, a read-only or forbidden folder, a damaged checkpoint,
another live writer, memory exhausted) from a bug: the first ends the run with its one
line on the console and its traceback only in the run's log; a bug keeps its traceback
in view. Library code that writes stays responsible for writing whole files or nothing
(``atomic``); this module only words the failure. Runtime layer: standard library only.
"""

from __future__ import annotations

import errno

from trnfrontier.runtime.atomic import DiskFullError
from trnfrontier.runtime.integrity import DamagedFileError
from trnfrontier.runtime.runlock import RunLockedError

# errno -> what the user can do about it.
_ADVICE = {
    errno.EROFS: "the file system is read-only; choose a writable location (e.g. --out / -o elsewhere)",
    errno.ENOSPC: "the device is full; free some space or choose a location on another disk",
    errno.EDQUOT: "the disk quota is used up; free some space or choose another location",
    errno.EACCES: "permission denied; choose a location you can write to, or change its permissions",
    errno.EPERM: "operation not permitted; choose a location you can write to, or change its permissions",
    errno.ENOENT: "a folder on the way does not exist; check the path",
    errno.ENOTDIR: "a part of the path is a file, not a folder; check the path",
    errno.EISDIR: "it is a folder; give a file name",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter path",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) and retry",
}
# Without a file name these still name a condition the user can fix.
_WITHOUT_PATH = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EMFILE}


def is_user_facing(exc: OSError) -> bool:
    """A filesystem failure the user can act on (anything else stays a bug, with its traceback)."""
    if exc.errno not in _ADVICE:
        return False
    return bool(exc.filename) or exc.errno in _WITHOUT_PATH


def describe(exc: OSError) -> str:
    """``PATH: No space left on device; the device is full; free some space ...``."""
    reason = exc.strerror or str(exc)
    where = exc.filename if exc.filename is not None else None
    if exc.filename2 is not None:
        where = f"{exc.filename} -> {exc.filename2}"
    advice = _ADVICE.get(exc.errno or 0, "")
    head = f"{where}: {reason}" if where else reason
    return f"{head}; {advice}" if advice else head


def fault_line(exc: BaseException) -> str | None:
    """The one line for an expected fault, or None when ``exc`` is a bug (keep its traceback).

    Expected: a filesystem failure the user can act on (``is_user_facing``; a full disk's
    ``DiskFullError`` already says how much it needs), a damaged or locked run directory
    (their messages name the file and the way out), memory exhausted."""
    if isinstance(exc, (DamagedFileError, RunLockedError)):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "out of memory (host RAM); lower data.batch_size or the model size, or free memory"
    if isinstance(exc, OSError) and is_user_facing(exc):
        return str(exc) if isinstance(exc, DiskFullError) else describe(exc)
    return None
