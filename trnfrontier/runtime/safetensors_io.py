"""Safetensors, read and written with the standard library and torch.

The format is an 8-byte little-endian header length, a JSON header (dtype, shape and
byte offsets per tensor, plus an optional ``__metadata__`` of strings) and the raw
little-endian tensor bytes; so a submission needs no extra package, and loading one
never unpickles anything.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch

_ST_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ST_TORCH = {name: dtype for dtype, name in _ST_DTYPES.items()}
_ST_MAX_HEADER = 100 * 1024 * 1024


def _tensor_bytes(t: torch.Tensor) -> bytes:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def write_safetensors(
    handle: IO[bytes],
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Serialise ``tensors`` in the safetensors format (what ``safetensors.torch.save`` writes)."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors is little-endian; this writer does not byte-swap")
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _ST_DTYPES:
            raise TypeError(
                f"tensor {name!r} has dtype {t.dtype}, which safetensors cannot store here"
            )
        blob = _tensor_bytes(t)
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    handle.write(struct.pack("<Q", len(raw)))
    handle.write(raw)
    for blob in blobs:
        handle.write(blob)


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load every tensor (on CPU) and the string metadata of a safetensors file."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: not a safetensors file (too short)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > _ST_MAX_HEADER or 8 + size > len(data):
        raise ValueError(f"{path}: not a safetensors file (bad header size)")
    try:
        header = json.loads(data[8 : 8 + size].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a safetensors file ({exc})") from None
    metadata = header.pop("__metadata__", None) or {}
    base = 8 + size
    tensors: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        dtype = _ST_TORCH.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}")
        begin, end = info["data_offsets"]
        shape = [int(d) for d in info["shape"]]
        if not 0 <= begin <= end <= len(data) - base:
            raise ValueError(f"{path}: tensor {name!r} lies outside the file")
        numel = 1
        for d in shape:
            numel *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        if end - begin != numel * itemsize:
            raise ValueError(
                f"{path}: tensor {name!r} has {end - begin} bytes for shape {shape} {info['dtype']}"
            )
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        # Copy into a fresh (aligned, writable) buffer before reinterpreting the bytes.
        buf = torch.frombuffer(bytearray(data[base + begin : base + end]), dtype=torch.uint8)
        tensors[name] = buf.view(dtype).reshape(shape)
    return tensors, metadata
