"""Safe extraction of a hostile archive into a temporary directory.

Three layers of defence. The archive must be in the canonical form ``trnf package``
writes (``canonical.py``), so that no tar reader can see other members than this one. PEP 706's ``data`` filter (``tarfile.data_filter``) is applied to
every member and its verdict is final; on top of it our own policy refuses what the
filter would merely rewrite or allow: any link, any special file, names that are not
canonical, duplicates, and too many / too large members or a suspicious compression
ratio (a gzip bomb is refused from the tar headers, before its bytes are inflated).

The bytes are written by us, not by ``TarFile.extract``: each file is created with
``O_EXCL | O_NOFOLLOW`` under the destination and hashed while it streams, so the
manifest check needs no second read and nothing can be written outside the destination.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from trnfrontier.runtime.atomic import DiskFullError, is_disk_full
from trnfrontier.submission import is_normalised_name, member_path
from trnfrontier.verify.canonical import canonical_problem

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What an archive may contain. Generous for a real submission (a 60M-parameter
    checkpoint is ~240 MB per copy), tight enough that a bomb is stopped at its headers."""

    max_members: int = 2_000
    max_file_bytes: int = 8 << 30
    max_total_bytes: int = 16 << 30
    # Float weights barely compress; text logs do (10-20x). Only judge the ratio once the
    # archive is big enough for it to matter.
    max_ratio: float = 100.0
    ratio_floor_bytes: int = 64 << 20


class ExtractionError(Exception):
    """The archive is refused; the message says which member and why."""


@dataclass
class Extracted:
    root: Path
    # member name -> {"size", "sha256"} as measured while writing it
    files: dict[str, dict[str, object]] = field(default_factory=dict)
    compressed_bytes: int = 0


def _refuse_member(member: tarfile.TarInfo, root: Path, seen: set[str]) -> str | None:
    """Our policy on one member header; the reason it is refused, or None."""
    name = member.name.rstrip("/") if member.isdir() else member.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return f"member {member.name!r} has an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return f"member {member.name!r} climbs out with '..'"
    if member.issym() or member.islnk():
        return f"member {member.name!r} is a {'symbolic' if member.issym() else 'hard'} link (to {member.linkname!r}); links are not allowed"
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        return f"member {member.name!r} is a device or FIFO; only regular files are allowed"
    if not (member.isfile() or member.isdir()):
        return f"member {member.name!r} has tar type {member.type!r}; only regular files are allowed"
    if not is_normalised_name(name):
        return f"member name {member.name!r} is not a plain relative path (letters, digits, '._-' and '/')"
    if name in seen:
        return f"member {name!r} appears twice"
    try:
        tarfile.data_filter(member, str(root))  # PEP 706: refuses anything leaving root
    except tarfile.FilterError as exc:
        return f"member {member.name!r} refused by the tarfile data filter: {exc}"
    return None


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, root: Path) -> dict[str, object]:
    # Parents are created one level at a time without following links; none can be a
    # link because we never create one, but check anyway: never trust the tree.
    rel_parent = target.parent.relative_to(root)
    current = root
    for part in rel_parent.parts:
        current = current / part
        if current.is_symlink():
            raise ExtractionError(f"refusing to write {member.name!r}: {current} is a link")
        current.mkdir(exist_ok=True)
    source = tar.extractfile(member)
    if source is None:
        raise ExtractionError(f"member {member.name!r} has no data")
    digest = hashlib.sha256()
    size = 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as sink:
        while block := source.read(_CHUNK):
            size += len(block)
            if size > member.size:  # a lying header: never write more than it declared
                raise ExtractionError(f"member {member.name!r} holds more data than its header says")
            digest.update(block)
            sink.write(block)
    if size != member.size:
        raise ExtractionError(f"member {member.name!r} is truncated ({size} of {member.size} bytes)")
    return {"size": size, "sha256": digest.hexdigest()}


def safe_extract(archive: Path, dest: Path, limits: Limits = Limits()) -> Extracted:
    """Extract ``archive`` into the existing empty directory ``dest``, or raise ExtractionError.

    All headers are judged before any byte is written, so a refused archive leaves
    nothing behind but what the caller's temporary directory holds.
    """
    root = dest.resolve()
    result = Extracted(root=root)
    members: list[tarfile.TarInfo] = []
    try:
        result.compressed_bytes = archive.stat().st_size
        with tarfile.open(archive, "r:*") as tar:
            seen: set[str] = set()
            total = 0
            for member in tar:  # streams headers; data of skipped members is not inflated into memory
                if len(members) >= limits.max_members:
                    raise ExtractionError(f"more than {limits.max_members} members")
                reason = _refuse_member(member, root, seen)
                if reason:
                    raise ExtractionError(reason)
                if member.size > limits.max_file_bytes:
                    raise ExtractionError(f"member {member.name!r} declares {member.size} bytes, over the {limits.max_file_bytes}-byte limit")
                total += member.size
                if total > limits.max_total_bytes:
                    raise ExtractionError(f"members total over the {limits.max_total_bytes}-byte limit")
                if total > limits.ratio_floor_bytes and total > limits.max_ratio * result.compressed_bytes:
                    raise ExtractionError(
                        f"expands to over {limits.max_ratio:g}x its {result.compressed_bytes}-byte size (a compression bomb?)"
                    )
                seen.add(member.name.rstrip("/"))
                members.append(member)
            if not members:
                raise ExtractionError("the archive is empty")
            problem = canonical_problem(archive, members)
            if problem:
                raise ExtractionError(f"not in the canonical form `trnf package` writes: {problem}; "
                                      "tar readers could disagree on its members, so re-package it with trnf package")
            for member in members:
                if member.isdir():
                    continue
                target = member_path(root, member.name)
                result.files[member.name] = _write_member(tar, member, target, root)
    except ExtractionError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError) as exc:
        if is_disk_full(exc):  # verify's own disk filled up: not a fault of the archive
            raise DiskFullError(
                root, sum(m.size for m in members), "verify's copy of the archive in",
                advice="free space there or point TMPDIR at a disk with room, then verify again",
            ) from None
        if isinstance(exc, tarfile.ReadError) and "opened successfully" in str(exc):
            raise ExtractionError("not a tar archive (neither plain tar nor gzip, bzip2 or xz compressed)") from None
        kind = type(exc).__name__
        raise ExtractionError(f"not a readable tar archive (truncated or corrupt: {kind}: {exc})") from None
    return result
