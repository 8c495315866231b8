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
