"""Validation text carried in an archive: long runs of the scored tokens, in any file, in any plain encoding.

A model that ships the public validation text (in train.py, a kernel file, a log, a tensor
of the checkpoint) can predict it by lookup: its score is not a language model's. The text
``--rerun-eval`` just scored is known token by token (``MixedPass.windows``), so every
member of the archive is searched for it:

- as text: every file that decodes as UTF-8 is tokenized with the trusted tokenizer;
- as token ids: any file's bytes read as little-endian int16, int32 or int64 at every
  alignment, and as float32 holding whole numbers, where a run of ids below the vocabulary
  is long enough to matter; lists of integer literals in Python files;
- unwrapped: string and bytes literals of Python files, and whole files, that decode as
  base64 or decompress (zlib, gzip, bzip2, xz) are searched again, one level down.

Matching is on hashes of ``NGRAM``-token windows; an archive member is refused when at least
``MIN_COVERED`` of its tokens lie inside windows of the scored text. Sixteen tokens (about
sixty characters) in a row rarely recur by chance between code and web text; 256 such tokens
are a paragraph and more, far from a license header quoted by both and far below any text
worth memorising.
"""

from __future__ import annotations

import ast
import base64
import binascii
import bz2
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

NGRAM = 16
MIN_COVERED = 256
_TEXT_CAP = 64 << 20  # bytes of one file tokenized as text
_UNWRAP_CAP = 256 << 20  # bytes one decompression may produce
_MIN_BLOB = 64  # bytes: shorter literals are not worth decoding
_MULT = np.uint64(0x9E3779B97F4A7C15)


def _hashes(tokens: np.ndarray) -> np.ndarray:
    """A hash of every NGRAM-token window of ``tokens`` (uint64; wrapping arithmetic)."""
    values: np.ndarray = tokens.astype(np.uint64)
    count = len(values) - NGRAM + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    h: np.ndarray = np.zeros(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(NGRAM):
            h = h * _MULT + values[k:k + count] + np.uint64(1)
    return h


@dataclass(frozen=True)
class Carried:
    member: str
    covered: int
    how: str

    def __str__(self) -> str:
        return f"{self.member} carries {self.covered:,} tokens of the public validation text just scored ({self.how})"


class ScoredText:
    """The hashes of every NGRAM-token window of the scored windows (each window with the next one's first token)."""

    def __init__(self, windows: list[Any], vocab: int) -> None:
        self.vocab = vocab
        rows = [np.asarray(w, dtype=np.int64) for w in windows]
        stream = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        self.known = np.unique(_hashes(stream))

    def covered(self, tokens: np.ndarray) -> int:
        """How many of ``tokens`` lie inside a window that is also in the scored text."""
        h = _hashes(tokens)
        if not len(h) or not len(self.known):
            return 0
        hit = np.isin(h, self.known)
        if not hit.any():
            return 0
        mark: np.ndarray = np.zeros(len(tokens) + 1, dtype=np.int32)
        starts = np.nonzero(hit)[0]
        np.add.at(mark, starts, 1)
        np.add.at(mark, starts + NGRAM, -1)
        return int((np.cumsum(mark)[:-1] > 0).sum())

    def _runs(self, values: np.ndarray) -> Iterator[np.ndarray]:
        """Maximal runs of ids in [0, vocab) at least NGRAM long (whole numbers, for a float view), as int64."""
        ok = (values >= 0) & (values < self.vocab)
        if values.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                ok &= values == np.floor(values)
        if not ok.any():
            return
        edges = np.diff(np.concatenate([[0], ok.astype(np.int8), [0]]))
        for start, stop in zip(np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0], strict=True):
            if stop - start >= NGRAM:
                yield values[start:stop].astype(np.int64)

    def in_bytes(self, data: bytes) -> tuple[int, str]:
        """The most scored tokens found in ``data`` read as integer or whole-float arrays, and which reading."""
        best, how = 0, ""
        raw = np.frombuffer(data, dtype=np.uint8)
        for dtype in ("<i2", "<i4", "<i8", "<f4"):
            width = np.dtype(dtype).itemsize
            for offset in range(width):
                usable = (len(raw) - offset) // width * width
                if usable < NGRAM * width:
                    continue
                values = raw[offset:offset + usable].view(dtype)
                found = sum(self.covered(run) for run in self._runs(values))
                if found > best:
                    best, how = found, f"as {'float32' if dtype == '<f4' else 'int' + str(width * 8)} token ids"
        return best, how


_CHUNK = 16 << 20
_OVERLAP = NGRAM * 8


def _chunks(path: Path) -> Iterator[bytes]:
    """The file in chunks that overlap by a window of int64s (so no run is cut in two)."""
    with open(path, "rb") as handle:
        tail = b""
        while block := handle.read(_CHUNK):
            yield tail + block
            tail = block[-_OVERLAP:]


def _unwrap(data: bytes) -> list[tuple[bytes, str]]:
    """``data`` decoded once: base64, zlib, gzip, bzip2, xz (each tried; what works is returned, capped)."""
    found: list[tuple[bytes, str]] = []
    attempts: list[tuple[str, Callable[[bytes], bytes]]] = [
        ("base64", lambda d: base64.b64decode(d, validate=False)),
        ("zlib", lambda d: zlib.decompressobj().decompress(d, _UNWRAP_CAP)),
        ("gzip", lambda d: zlib.decompressobj(wbits=31).decompress(d, _UNWRAP_CAP)),
        ("bzip2", lambda d: bz2.BZ2Decompressor().decompress(d, _UNWRAP_CAP)),
        ("xz", lambda d: lzma.LZMADecompressor().decompress(d, _UNWRAP_CAP)),
    ]
    for name, decode in attempts:
        try:
            out = decode(data)
        except (ValueError, binascii.Error, zlib.error, OSError, EOFError, lzma.LZMAError):
            continue
        if len(out) >= _MIN_BLOB and out != data:
            found.append((out, name))
    return found


def _literals(source: bytes) -> tuple[list[bytes], list[list[int]]]:
    """String/bytes literals and integer lists of a Python file (none when it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [], []
    blobs: list[bytes] = []
    ints: list[list[int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)) and len(node.value) >= _MIN_BLOB:
            blobs.append(node.value.encode("utf-8", "surrogatepass") if isinstance(node.value, str) else node.value)
        elif isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) >= NGRAM:
            values = [e.value for e in node.elts if isinstance(e, ast.Constant) and type(e.value) is int]
            if len(values) >= NGRAM:
                ints.append(values)
    return blobs, ints


def _as_text(data: bytes, tokenizer: Any) -> np.ndarray | None:
    if len(data) > _TEXT_CAP:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return np.asarray(tokenizer.encode(text), dtype=np.int64)


def _scan_blob(scored: ScoredText, data: bytes, tokenizer: Any, depth: int) -> tuple[int, str]:
    best, how = 0, ""
    tokens = _as_text(data, tokenizer)
    if tokens is not None:
        best, how = scored.covered(tokens), "as text"
    found, reading = scored.in_bytes(data)
    if found > best:
        best, how = found, reading
    if depth > 0:
        for inner, name in _unwrap(data):
            got, inner_how = _scan_blob(scored, inner, tokenizer, depth - 1)
            if got > best:
                best, how = got, f"{name}-encoded, {inner_how}"
    return best, how


def _scan_member(scored: ScoredText, path: Path, tokenizer: Any) -> tuple[int, str]:
    size = path.stat().st_size
    if size <= _TEXT_CAP:
        data = path.read_bytes()
        best, how = _scan_blob(scored, data, tokenizer, depth=1)
        if path.suffix == ".py":
            blobs, ints = _literals(data)
            for blob in blobs:
                got, inner = _scan_blob(scored, blob, tokenizer, depth=2)
                if got > best:
                    best, how = got, f"in a string literal, {inner}"
            for values in ints:
                got = scored.covered(np.asarray(values, dtype=np.int64))
                if got > best:
                    best, how = got, "as a list of token ids"
        return best, how
    # A big binary (a checkpoint): token ids only, chunk by chunk, in flat memory.
    total, how = 0, ""
    for chunk in _chunks(path):
        got, reading = scored.in_bytes(chunk)
        total += got
        how = how or reading
    return total, how


def carried(scored: ScoredText, root: Path, names: list[str], tokenizer: Any) -> list[Carried]:
    """Every member of the archive at ``root`` that carries at least ``MIN_COVERED`` scored tokens."""
    out = []
    for name in sorted(names):
        best, how = _scan_member(scored, root / name, tokenizer)
        if best >= MIN_COVERED:
            out.append(Carried(name, best, how))
    return out
