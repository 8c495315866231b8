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

verify's memory stays flat whatever a member holds: bytes are searched ``_BLOCK`` at a time,
tokens hashed ``_HASH_TOKENS`` at a time, text decoded and tokenized ``_TEXT_PIECE`` bytes at
a time. A member's own bytes are all searched (a checkpoint of any size, streamed); what
decoding and decompressing it yields is searched up to ``SCAN_CAP`` bytes per member, and
one decompression may yield at most ``UNWRAP_CAP``: a member past either is refused, since
text could lie beyond what was searched (no honest member holds a compressed stream).
"""

from __future__ import annotations

import ast
import base64
import binascii
import bz2
import codecs
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

NGRAM = 16
MIN_COVERED = 256
_TEXT_CAP = 64 << 20  # bytes of one file read whole (a bigger one is streamed, as token ids only)
UNWRAP_CAP = 32 << 20  # bytes one decompression may produce
SCAN_CAP = 256 << 20  # bytes of decoded and decompressed content searched per member, all of it together
_HASH_TOKENS = 1 << 20  # tokens hashed at a time: tens of MiB of temporaries at most
_BLOCK = 4 << 20  # bytes read as token ids at a time
_TEXT_PIECE = 1 << 20  # bytes decoded and tokenized as text at a time
_MIN_BLOB = 64  # bytes: shorter literals are not worth decoding
# A .py file parsed for its literals at most (the gate's upload-size check holds code to 256 KiB).
_PARSE_CAP = 1 << 20
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


class _OverCap(Exception):
    """A member whose decoded contents exceed what the scan searches; the message says which limit."""


@dataclass(frozen=True)
class Carried:
    member: str
    covered: int
    how: str
    refused: str = ""  # a limit of the scan the member ran past (then ``covered`` is what was found before it)

    def __str__(self) -> str:
        if self.refused:
            return f"{self.member}: {self.refused}; the public validation text could lie past what was searched"
        return f"{self.member} carries {self.covered:,} tokens of the public validation text just scored ({self.how})"


class _Stream:
    """Scored tokens found in a stream of token pieces (one text, one run of ids), hashed
    ``_HASH_TOKENS`` at a time; windows across piece boundaries are hashed too."""

    def __init__(self, known: np.ndarray) -> None:
        self.known = known
        self.carry: np.ndarray = np.zeros(0, dtype=np.int64)
        self.pos = 0  # tokens fed so far
        self.last: int | None = None  # the start of the last window found (global)
        self.total = 0

    def feed(self, tokens: np.ndarray) -> None:
        for at in range(0, len(tokens), _HASH_TOKENS):
            piece: np.ndarray = tokens[at:at + _HASH_TOKENS].astype(np.int64)
            seq = np.concatenate([self.carry, piece])
            base = self.pos - len(self.carry)
            h = _hashes(seq)
            if len(h) and len(self.known):
                index = np.minimum(np.searchsorted(self.known, h), len(self.known) - 1)
                self._count(np.nonzero(self.known[index] == h)[0] + base)
            self.carry = seq[len(seq) - min(len(seq), NGRAM - 1):]
            self.pos += len(piece)

    def _count(self, starts: np.ndarray) -> None:
        """Add the tokens that windows starting at ``starts`` (sorted, global) cover and earlier ones did not."""
        if not len(starts):
            return
        before = self.last if self.last is not None else int(starts[0]) - NGRAM
        self.total += int(np.minimum(np.diff(starts, prepend=before), NGRAM).sum())
        self.last = int(starts[-1])


class ScoredText:
    """The hashes of every NGRAM-token window of the scored windows (each window with the next one's first token)."""

    def __init__(self, windows: list[Any], vocab: int) -> None:
        self.vocab = vocab
        rows = [np.asarray(w, dtype=np.int64) for w in windows]
        stream = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
        self.known = np.unique(_hashes(stream))  # sorted: searched with searchsorted

    def covered(self, tokens: np.ndarray) -> int:
        """How many of ``tokens`` lie inside a window that is also in the scored text (bounded memory)."""
        stream = self.stream()
        stream.feed(tokens)
        return stream.total

    def stream(self) -> _Stream:
        return _Stream(self.known)

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
                yield values[start:stop]

    def in_bytes(self, data: bytes) -> tuple[int, str]:
        """The most scored tokens found in ``data`` read as integer or whole-float arrays, and which
        reading; ``_BLOCK`` bytes at a time (overlapping by a window of int64s), summed over blocks."""
        total, how = 0, ""
        for at in range(0, max(len(data) - _OVERLAP, 1), _BLOCK):
            got, reading = self._in_block(memoryview(data)[at:at + _BLOCK + _OVERLAP])
            total += got
            how = how or reading
        return total, how

    def _in_block(self, data: memoryview) -> tuple[int, str]:
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


def _unwrap(data: bytes) -> Iterator[tuple[bytes, str]]:
    """``data`` decoded once: base64, zlib, gzip, bzip2, xz (each tried; what works, one at a time).
    A decompression past ``UNWRAP_CAP`` is ``_OverCap``: what lies beyond it would go unsearched."""
    attempts: list[tuple[str, Callable[[bytes], bytes]]] = [
        ("base64", lambda d: base64.b64decode(d, validate=False)),  # never longer than its input
        ("zlib", lambda d: zlib.decompressobj().decompress(d, UNWRAP_CAP + 1)),
        ("gzip", lambda d: zlib.decompressobj(wbits=31).decompress(d, UNWRAP_CAP + 1)),
        ("bzip2", lambda d: bz2.BZ2Decompressor().decompress(d, UNWRAP_CAP + 1)),
        ("xz", lambda d: lzma.LZMADecompressor().decompress(d, UNWRAP_CAP + 1)),
    ]
    for name, decode in attempts:
        try:
            out = decode(data)
        except (ValueError, binascii.Error, zlib.error, OSError, EOFError, lzma.LZMAError):
            continue
        if len(out) > UNWRAP_CAP:
            raise _OverCap(f"a {name} stream in it inflates past {UNWRAP_CAP:,} bytes, the scan's limit for one decompression")
        if len(out) >= _MIN_BLOB and out != data:
            yield out, name
        del out


class _Budget:
    """The bytes of decoded and decompressed content still to be searched in one member (``SCAN_CAP``)."""

    def __init__(self) -> None:
        self.left = SCAN_CAP

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise _OverCap(f"decoding and decompressing it gives over {SCAN_CAP:,} bytes to search, the scan's limit per member")


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


def _text_covered(scored: ScoredText, data: bytes, tokenizer: Any) -> int | None:
    """Scored tokens in ``data`` read as UTF-8 text, ``_TEXT_PIECE`` bytes at a time (each piece cut
    before its last space, so pieces tokenize as the whole does); None when it is not UTF-8."""
    if len(data) > _TEXT_CAP:
        return None
    decoder = codecs.getincrementaldecoder("utf-8")()
    stream, pending = scored.stream(), ""
    try:
        for at in range(0, len(data), _TEXT_PIECE):
            final = at + _TEXT_PIECE >= len(data)
            pending += decoder.decode(data[at:at + _TEXT_PIECE], final=final)
            cut = len(pending) if final or pending.rfind(" ") <= 0 else pending.rfind(" ")
            stream.feed(np.asarray(tokenizer.encode(pending[:cut]), dtype=np.int64))
            pending = pending[cut:]
    except UnicodeDecodeError:
        return None
    return stream.total


def _scan_blob(scored: ScoredText, data: bytes, tokenizer: Any, depth: int, budget: _Budget) -> tuple[int, str]:
    best, how = 0, ""
    text = _text_covered(scored, data, tokenizer)
    if text is not None:
        best, how = text, "as text"
    found, reading = scored.in_bytes(data)
    if found > best:
        best, how = found, reading
    if depth > 0:
        for inner, name in _unwrap(data):
            budget.spend(len(inner))
            got, inner_how = _scan_blob(scored, inner, tokenizer, depth - 1, budget)
            if got > best:
                best, how = got, f"{name}-encoded, {inner_how}"
    return best, how


def _scan_member(scored: ScoredText, path: Path, tokenizer: Any) -> tuple[int, str]:
    """The most scored tokens one reading of the member finds; ``_OverCap`` past a limit of the scan."""
    size = path.stat().st_size
    if size > _TEXT_CAP:
        # A big binary (a checkpoint): token ids only, chunk by chunk, in flat memory.
        total, how = 0, ""
        for chunk in _chunks(path):
            got, reading = scored.in_bytes(chunk)
            total += got
            how = how or reading
        return total, how
    data, budget = path.read_bytes(), _Budget()
    best, how = _scan_blob(scored, data, tokenizer, 1, budget)
    if path.suffix == ".py" and size <= _PARSE_CAP:
        blobs, ints = _literals(data)
        for blob in blobs:
            got, inner = _scan_blob(scored, blob, tokenizer, 2, budget)
            if got > best:
                best, how = got, f"in a string literal, {inner}"
        for values in ints:
            got = scored.covered(np.asarray(values, dtype=np.int64))
            if got > best:
                best, how = got, "as a list of token ids"
    return best, how


def carried(scored: ScoredText, root: Path, names: list[str], tokenizer: Any) -> list[Carried]:
    """Every member of the archive at ``root`` that carries at least ``MIN_COVERED`` scored tokens,
    or that ran past a limit of the scan (``Carried.refused``)."""
    out = []
    for name in sorted(names):
        try:
            best, how = _scan_member(scored, root / name, tokenizer)
        except _OverCap as exc:
            out.append(Carried(name, 0, "", refused=str(exc)))
            continue
        if best >= MIN_COVERED:
            out.append(Carried(name, best, how))
    return out
