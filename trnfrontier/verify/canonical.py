"""One reading of an archive: it must be byte for byte what ``trnf package`` would write.

Tar readers disagree on malformed archives: Python's tarfile stops at an invalid header
while GNU tar skips it and extracts what follows, so a second ``train.py`` hidden after a
bad header is invisible to one reader and overwrites the screened file for another. An
archive in the canonical form cannot be read two ways: members sorted by name, each
header exactly the one ``write_deterministic_tar`` writes for that name and size (PAX,
mtime 0, owner 0, mode 0644), data padded with zeros, then the end-of-archive zeros up
to the record size, and nothing else. A gzip/bzip2/xz archive is judged by the tar it
decompresses to.

The check reads headers, padding and trailer only; member data is skipped (a seek for a
plain tar), so its cost does not grow with the checkpoint's size.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import tarfile
from pathlib import Path
from typing import IO, cast

from trnfrontier.submission import canonical_header

_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_MAGIC = ((b"\x1f\x8b", gzip.open), (b"BZh", bz2.open), (b"\xfd7zXZ\x00", lzma.open))


def _open(archive: Path) -> tuple[IO[bytes], bool]:
    """The decompressed tar stream, and whether it is the plain file itself (seekable for free)."""
    with open(archive, "rb") as handle:
        head = handle.read(6)
    for magic, opener in _MAGIC:
        if head.startswith(magic):
            return cast(IO[bytes], opener(archive, "rb")), False
    return open(archive, "rb"), True


def _skip(stream: IO[bytes], n: int, plain: bool) -> bool:
    """Move ``n`` bytes forward; False when the stream ends first."""
    if plain:  # past the data without reading it; a short file shows up as a short padding/trailer read
        stream.seek(n, 1)
        return True
    while n:
        block = stream.read(min(n, 1 << 20))
        if not block:
            return False
        n -= len(block)
    return True


def canonical_problem(archive: Path, members: list[tarfile.TarInfo]) -> str | None:
    """Why ``archive`` (whose members tarfile listed as ``members``) is not canonical, or None."""
    names = [m.name for m in members]
    if any(not m.isfile() for m in members):
        return "it has directory entries"
    if names != sorted(names):
        return "its members are not in sorted order"
    try:
        return _walk(archive, members)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        return f"its compressed stream does not read cleanly ({type(exc).__name__})"


def _walk(archive: Path, members: list[tarfile.TarInfo]) -> str | None:
    stream, plain = _open(archive)
    with stream:
        offset = 0
        for member in members:
            expected = canonical_header(member.name, member.size)
            if member.offset != offset or stream.read(len(expected)) != expected:
                return f"member {member.name!r} has a header other than the one trnf package writes"
            offset += len(expected)
            padded = member.size + (-member.size % _BLOCK)
            if not _skip(stream, member.size, plain) or stream.read(padded - member.size) != bytes(padded - member.size):
                return f"member {member.name!r} is not zero-padded"
            offset += padded
        end = offset + 2 * _BLOCK
        end += -end % _RECORD
        trailer = stream.read(end - offset)
        if trailer != bytes(end - offset):
            return f"there are bytes other than the end-of-archive zeros after the last member (at byte {offset}): a hidden member?"
        if stream.read(1):
            return f"there is data after the end of the archive (byte {end})"
    return None
