"""valtext: the scored validation text is found in an archive member however it is written down, and code is not mistaken for it."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trnfrontier.runtime import prepare_calls
from trnfrontier.verify.valtext import MIN_COVERED, ScoredText, carried

SEQ = 64


@pytest.fixture(scope="module")
def scored(sample_home: Path, prepare_module: Any) -> tuple[ScoredText, list[Any], Any]:
    """The windows the trusted evaluate_bpb scores (8,192 tokens at 64), as MixedPass records them."""
    tokenizer = prepare_calls.ensure_tokenizer(prepare_module)
    windows: list[Any] = []

    class Recorder(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            windows.extend(row.clone() for row in x)
            return torch.zeros(*x.shape, 8192)

    prepare_calls.evaluate_bpb(prepare_module, Recorder(), tokenizer, 8, SEQ, "cpu", split="public_val", max_tokens=8192)
    return ScoredText(windows, 8192), windows, tokenizer


def _text(windows: list[Any], tokenizer: Any, count: int = 12) -> str:
    return tokenizer.decode(torch.cat(windows[3:3 + count]).tolist())


def _archive(tmp_path: Path, files: dict[str, bytes]) -> tuple[Path, list[str]]:
    for name, data in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return tmp_path, sorted(files)


def test_plain_code_and_logs_are_not_validation_text(scored, tmp_path: Path) -> None:
    text, _, tokenizer = scored
    repo = Path(__file__).resolve().parents[2]
    files = {"train.py": (repo / "tests" / "verify" / "verify_kit.py").read_bytes(),
             "runtime/model.py": (repo / "trnfrontier" / "runtime" / "model.py").read_bytes(),
             "WRITEUP.md": (repo / "README.md").read_bytes()}
    root, names = _archive(tmp_path, files)
    assert carried(text, root, names, tokenizer) == []


def _ids(windows: list[Any], count: int = 12) -> np.ndarray:
    return torch.cat(windows[3:3 + count]).numpy()


CARRIERS = {
    "text-in-a-string": lambda w, t: {"train.py": f"TABLE = {_text(w, t)!r}\n".encode()},
    "text-in-the-writeup": lambda w, t: {"WRITEUP.md": _text(w, t).encode()},
    "zlib-base64-literal": lambda w, t: {"train.py": f"B = {base64.b64encode(zlib.compress(_text(w, t).encode())).decode()!r}\n".encode()},
    "token-id-list": lambda w, t: {"kernels/ids.py": f"IDS = {_ids(w).tolist()}\n".encode()},
    "int16-ids-in-a-binary": lambda w, t: {"checkpoint/blob.bin": b"\x01" + _ids(w).astype("<i2").tobytes() + b"\x00" * 7},
    "int32-ids-in-a-binary": lambda w, t: {"checkpoint/blob.bin": b"\x00" * 3 + _ids(w).astype("<i4").tobytes()},
    "float32-ids-in-a-binary": lambda w, t: {"checkpoint/blob.bin": _ids(w).astype("<f4").tobytes()},
    "ids-in-a-safetensors-tensor": lambda w, t: {"checkpoint/model.safetensors": _safetensors(_ids(w))},
}


def _safetensors(ids: np.ndarray) -> bytes:
    header = b'{"t": {"dtype": "I64", "shape": [%d], "data_offsets": [0, %d]}}' % (len(ids), 8 * len(ids))
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + ids.astype("<i8").tobytes()


@pytest.mark.parametrize("case", sorted(CARRIERS))
def test_validation_text_is_found_and_the_member_named(case: str, scored, tmp_path: Path) -> None:
    text, windows, tokenizer = scored
    files = CARRIERS[case](windows, tokenizer)
    root, names = _archive(tmp_path, {"train.py": b"import torch\n", **files})
    found = carried(text, root, names, tokenizer)
    assert [c.member for c in found] == sorted(files), found
    assert found[0].covered >= MIN_COVERED and "public validation text" in str(found[0])


def test_a_stretch_across_hashing_and_block_boundaries_is_counted_once(scored, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashed a few tokens at a time and read a few bytes at a time, the count is the whole one."""
    from trnfrontier.verify import valtext

    text, windows, _ = scored
    ids = _ids(windows)
    whole = text.covered(ids)
    data = b"\x01" + ids.astype("<i4").tobytes()
    in_one, _ = text.in_bytes(data)
    monkeypatch.setattr(valtext, "_HASH_TOKENS", 37)
    assert text.covered(ids) == whole == len(ids)
    monkeypatch.setattr(valtext, "_BLOCK", 4096)
    in_blocks, how = text.in_bytes(data)
    # Each block overlaps the next by a window of int64s: counted twice there, never lost.
    assert in_one == len(ids) and len(ids) <= in_blocks <= len(ids) + (len(data) // 4096 + 1) * valtext._OVERLAP // 4
    assert how == "as int32 token ids"


def test_text_tokenized_in_pieces_finds_what_the_whole_finds(scored, monkeypatch: pytest.MonkeyPatch) -> None:
    from trnfrontier.verify import valtext

    text, windows, tokenizer = scored
    data = _text(windows, tokenizer).encode()
    whole = valtext._text_covered(text, data, tokenizer)
    monkeypatch.setattr(valtext, "_TEXT_PIECE", 509)
    pieces = valtext._text_covered(text, data, tokenizer)
    assert whole is not None and pieces is not None and whole >= MIN_COVERED and pieces >= 0.9 * whole, (whole, pieces)


def test_a_decompression_bomb_is_refused_naming_the_limit(scored, tmp_path: Path) -> None:
    from trnfrontier.verify.valtext import UNWRAP_CAP

    text, _, tokenizer = scored
    bomb = base64.b64encode(zlib.compress(b"\0" * (UNWRAP_CAP + 1024), 9)).decode()
    root, names = _archive(tmp_path, {"train.py": f"B = {bomb!r}\n".encode()})
    found = carried(text, root, names, tokenizer)
    assert [c.member for c in found] == ["train.py"] and found[0].refused, found
    assert f"inflates past {UNWRAP_CAP:,} bytes" in str(found[0]) and "public validation text" in str(found[0])


# A child that scans one member and prints its own peak RSS growth (KiB), so the bound is this scan's alone.
_PEAK = """
import resource, sys, zlib
from pathlib import Path
import numpy as np
from trnfrontier.verify.valtext import ScoredText, carried

class Tokenizer:  # one token a byte: the most tokens a text can give
    def encode(self, text):
        return list(text.encode("utf-8", "surrogatepass"))

scored = ScoredText([np.arange(64) % 200], 8192)
root, name = Path(sys.argv[1]), sys.argv[2]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
found = carried(scored, root, [name], Tokenizer())
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, [str(c) for c in found])
"""


@pytest.mark.parametrize("case", ["16 MiB of zeros", "zlib inflating to 256 MiB"])
def test_a_large_repetitive_member_is_scanned_in_bounded_memory(case: str, tmp_path: Path) -> None:
    """A member of zeros read as int16 ids is one run of 8M ids per 16 MiB, and as text 16M tokens.
    Measured (the child below, a loaded 2-core box): 16 MiB of zeros grew the scan by 528 MiB before
    (uint64 arrays of the whole run), 101 MiB now; the zlib member was inflated to 256 MiB and
    scanned whole (GBs), and is now refused at ``UNWRAP_CAP``."""
    import subprocess
    import sys

    root = tmp_path / "archive"
    (root / "logs").mkdir(parents=True)
    if case == "16 MiB of zeros":
        name, size = "WRITEUP.md", 16 << 20
        (root / name).write_bytes(b"\0" * size)
    else:
        name = "logs/blob.bin"
        compressor = zlib.compressobj(9)
        (root / name).write_bytes(b"".join(compressor.compress(b"\0" * (1 << 20)) for _ in range(256)) + compressor.flush())
        size = (root / name).stat().st_size
    out = subprocess.run([sys.executable, "-c", _PEAK, str(root), name], capture_output=True, text=True, timeout=900,
                         cwd=Path(__file__).resolve().parents[2], check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    grown_kib, found = out.stdout.split(" ", 1)
    # The member is read whole (up to 64 MiB); the rest is blocks and pieces: a generous bound of
    # the member's size + 128 MiB, against the GBs an unbounded scan built.
    assert int(grown_kib) < (size + (128 << 20)) // 1024, (case, grown_kib, found)
    if case == "16 MiB of zeros":
        assert found.strip() == "[]", found
    else:
        assert "inflates past" in found, found
