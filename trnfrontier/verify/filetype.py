"""What a file is, in a few words, when it is not the tar archive verify expects: the one
line `trnf verify` leads with, instead of a table of checks that never ran."""

from __future__ import annotations

import tarfile
from pathlib import Path

# Leading bytes -> what they mean (the common things handed to verify by mistake).
_MAGIC = (
    (b"PK\x03\x04", "a zip archive"),
    (b"\x1f\x8b", "gzip-compressed data that holds no tar archive"),
    (b"BZh", "bzip2-compressed data that holds no tar archive"),
    (b"\xfd7zXZ\x00", "xz-compressed data that holds no tar archive"),
    (b"%PDF", "a PDF document"),
    (b"\x7fELF", "an executable (ELF)"),
    (b"PK\x05\x06", "an empty zip archive"),
)
_SNIFF = 512


def not_an_archive(path: Path) -> str | None:
    """None when ``path`` is a tar archive (plain or gzip/bzip2/xz compressed); otherwise
    what it is instead ("a 6-byte text file starting 'hello'", "a zip archive", ...)."""
    try:
        if tarfile.is_tarfile(path):
            return None
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(_SNIFF)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if size == 0:
        return "an empty file"
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"{what} ({size:,} bytes)"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"{size:,} bytes of binary data"
    first = text.strip().splitlines()[0][:40] if text.strip() else ""
    start = f" starting {first!r}" if first else ""
    return f"a {size:,}-byte text file{start}"
