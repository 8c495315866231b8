"""The checkpoint rules: which file a kit-style run's checkpoint is, and that it loads without
running code, holds only finite numbers and has the claimed size.

``find_checkpoint`` is the one search (a kit run, the kit's and verify's dry runs): the
kit's ``out/final.pt`` first, else the newest ``*.pt`` a few folders deep.

``model.safetensors`` is read by its own header (JSON) and streamed in chunks: no pickle,
flat memory, and NaN/inf are found from the exponent bits, so bfloat16 and fp8 need no
conversion. ``final.pt`` goes through ``torch.load(weights_only=True)``, whose unpickler
refuses any global outside torch's allowlist, so a pickle payload is never executed.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trnfrontier.contract.jsonstrict import StrictJSONError, strict_loads
from trnfrontier.contract.kit import CHECKPOINT as KIT_CHECKPOINT

_CHUNK_BYTES = 16 << 20
_MAX_HEADER_BYTES = 16 << 20  # a header names tensors: ~100 bytes each
_MAX_DIMS = 8
_MAX_DIM = 1 << 40
# Metadata (safetensors' __metadata__, final.pt's model_config and meta) describes a model; it
# never holds one. Weights anywhere but the tensors verify checks would be scored unchecked.
MAX_METADATA_BYTES = 64 << 10
_MAX_PICKLE_BYTES = 64 << 20

# safetensors dtype -> (bytes per element, unsigned view, exponent mask | None for non-float)
# A float is NaN or inf exactly when all its exponent bits are set (E4M3: 0x7F/0xFF only).
_DTYPES: dict[str, tuple[int, Any, int | None]] = {
    "F64": (8, np.uint64, 0x7FF0000000000000),
    "F32": (4, np.uint32, 0x7F800000),
    "F16": (2, np.uint16, 0x7C00),
    "BF16": (2, np.uint16, 0x7F80),
    "F8_E5M2": (1, np.uint8, 0x7C),
    "F8_E4M3": (1, np.uint8, 0x7F),
    "I64": (8, np.uint64, None), "I32": (4, np.uint32, None), "I16": (2, np.uint16, None),
    "I8": (1, np.uint8, None), "U8": (1, np.uint8, None), "BOOL": (1, np.uint8, None),
    "U16": (2, np.uint16, None), "U32": (4, np.uint32, None), "U64": (8, np.uint64, None),
}


# How deep under a script's directory ``find_checkpoint`` looks for a ``*.pt``: out/final.pt
# is 2, a step folder under checkpoints/ is 3.
SEARCH_DEPTH = 3


def find_checkpoint(root: Path, *, since: float | None = None, exclude: Path | None = None,
                    preferred: Path = KIT_CHECKPOINT, skip: Callable[[Path], bool] | None = None) -> Path | None:
    """The checkpoint a run wrote under ``root`` (a kit script's directory, a dry run's copy of it,
    a kit run's own output folder): ``preferred`` (the kit's ``out/final.pt``; ``final.pt`` in
    an output folder), else the newest ``*.pt`` at most ``SEARCH_DEPTH`` levels deep, outside
    hidden folders, ``exclude`` (trnf's own run directory when it lies under ``root``) and files
    ``skip`` names. With ``since``, only files written at or after it (not a previous run's)."""

    def fresh(path: Path) -> bool:
        return path.is_file() and (since is None or path.stat().st_mtime >= since)

    kit = root / preferred
    if fresh(kit):
        return kit
    found: list[Path] = []
    for depth in range(1, SEARCH_DEPTH + 1):
        for path in root.glob("/".join(["*"] * depth) + ".pt"):
            hidden = any(part.startswith(".") for part in path.relative_to(root).parts)
            if (not hidden and (exclude is None or exclude not in path.parents) and (skip is None or not skip(path))
                    and fresh(path)):
                found.append(path)
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


class CheckpointError(ValueError):
    pass


@dataclass(frozen=True)
class TensorSummary:
    params: int
    tensors: int
    non_finite: list[str]


def _count(shape: list[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def scan_safetensors(path: Path) -> TensorSummary:
    """Validate a safetensors file's header and scan every float tensor for NaN/inf, chunk by chunk."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path.name} is too short to be safetensors")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{path.name}: header length {header_len} is impossible for a {size}-byte file")
        try:
            header = strict_loads(handle.read(header_len), what=f"{path.name}'s header")
        except StrictJSONError as exc:
            raise CheckpointError(str(exc)) from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path.name}: header is not a JSON object")
        _check_metadata(path.name, header.pop("__metadata__", None))
        data_start = 8 + header_len
        data_len = size - data_start
        spans: list[tuple[int, int, str, dict[str, Any]]] = []
        for name, info in header.items():
            try:
                dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(f"{path.name}: tensor {name!r} has a malformed entry") from None
            if not isinstance(dtype, str) or dtype not in _DTYPES:
                raise CheckpointError(f"{path.name}: tensor {name[:80]!r} has unknown dtype {str(dtype)[:40]!r}")
            if not (isinstance(shape, list) and len(shape) <= _MAX_DIMS
                    and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _MAX_DIM for d in shape)):
                raise CheckpointError(f"{path.name}: tensor {name[:80]!r} has a bad shape {str(shape)[:60]}")
            if not (type(begin) is int and type(end) is int and 0 <= begin <= end <= data_len):
                raise CheckpointError(f"{path.name}: tensor {name!r} points outside the file")
            if end - begin != _count(shape) * _DTYPES[dtype][0]:
                raise CheckpointError(f"{path.name}: tensor {name!r} byte span does not match its shape and dtype")
            spans.append((begin, end, name, info))
        spans.sort()
        covered = 0
        for begin, end, name, _ in spans:
            if begin < covered:
                raise CheckpointError(f"{path.name}: tensor {name[:80]!r} overlaps the one before it")
            if begin > covered:
                raise CheckpointError(f"{path.name}: {begin - covered:,} bytes before tensor {name[:80]!r} belong to no tensor (slack)")
            covered = end
        if covered != data_len:
            raise CheckpointError(f"{path.name}: {data_len - covered:,} bytes after the last tensor belong to no tensor (slack)")
        params = 0
        non_finite: list[str] = []
        for begin, end, name, info in spans:
            width, view, mask = _DTYPES[info["dtype"]]
            params += _count(info["shape"])
            if mask is None or end == begin:
                continue
            handle.seek(data_start + begin)
            remaining = end - begin
            step = _CHUNK_BYTES - _CHUNK_BYTES % width
            while remaining:
                block = handle.read(min(step, remaining))
                if not block:
                    raise CheckpointError(f"{path.name}: truncated inside tensor {name!r}")
                remaining -= len(block)
                bits = np.frombuffer(block, dtype=view)
                if info["dtype"] == "F8_E4M3":
                    bad = np.any((bits & 0x7F) == 0x7F)
                else:
                    bad = np.any((bits & view(mask)) == view(mask))
                if bad:
                    non_finite.append(name)
                    break
    return TensorSummary(params=params, tensors=len(spans), non_finite=non_finite)


def _check_metadata(where: str, metadata: Any) -> None:
    """safetensors' ``__metadata__``: text to text, small (it describes the model, never holds one)."""
    if metadata is None:
        return
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise CheckpointError(f"{where}: __metadata__ is not a map of text to text")
    size = sum(len(k) + len(v) for k, v in metadata.items())
    if size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{where}: __metadata__ holds {size:,} characters (at most {MAX_METADATA_BYTES:,}): weights belong in tensors")


def _plain_size(value: Any, where: str) -> int:
    """Characters of plain data (numbers, text, lists, dicts) in ``value``; CheckpointError on anything else."""
    total, todo = 0, [value]
    while todo:
        item = todo.pop()
        if item is None or isinstance(item, (bool, int, float)):
            total += 8
        elif isinstance(item, str):
            total += len(item)
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        else:
            raise CheckpointError(f"final.pt's {where} holds a {type(item).__name__}: weights belong in model_state, settings are plain data")
        if total > MAX_METADATA_BYTES:
            raise CheckpointError(f"final.pt's {where} holds over {MAX_METADATA_BYTES:,} bytes of data: weights belong in model_state")
    return total


def _pickle_size(path: Path) -> None:
    """Refuse a final.pt whose pickle (loaded into memory whole) is over the cap, before loading it."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zipped:
            sizes = [i.file_size for i in zipped.infolist() if i.filename.endswith("data.pkl")]
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not the zip format: torch.load says what it is
    if any(size > _MAX_PICKLE_BYTES for size in sizes):
        raise CheckpointError(f"{path.name}: its pickle is {max(sizes):,} bytes (at most {_MAX_PICKLE_BYTES:,})")


def _storage_slack(state: dict[str, Any]) -> str | None:
    """The first tensor whose storage holds bytes no tensor of model_state covers (data hidden beside it)."""
    spans: dict[int, list[tuple[int, int, str]]] = {}
    sizes: dict[int, int] = {}
    for name, tensor in state.items():
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        sizes[key] = storage.nbytes()
        start = tensor.storage_offset() * tensor.element_size()
        extent = (sum((n - 1) * st for n, st in zip(tensor.shape, tensor.stride(), strict=True)) + 1) * tensor.element_size() if tensor.numel() else 0
        spans.setdefault(key, []).append((start, start + extent, str(name)))
    for key, parts in spans.items():
        covered = 0
        for begin, end, name in sorted(parts):
            if begin > covered:
                return name
            covered = max(covered, end)
        if covered < sizes[key]:
            return sorted(parts)[-1][2]
    return None


def scan_final_pt(path: Path) -> TensorSummary:
    """Load the kit-layout final.pt without unpickling code and scan its model_state."""
    import torch

    _pickle_size(path)
    try:
        # mmap keeps the weights on disk; weights_only refuses every non-allowlisted global.
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - hostile bytes raise anything; every one means "does not load"
        text = str(exc)
        unsafe = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        why = (f"its pickle calls {unsafe.group(1)}, outside torch's weights-only allowlist; refused unexecuted"
               if unsafe else (text.strip().splitlines() or [type(exc).__name__])[0][:160])
        raise CheckpointError(f"{path.name} does not load with weights_only=True ({why})") from None
    if not isinstance(data, dict) or "model_state" not in data:
        raise CheckpointError(f"{path.name} is not the kit layout (a dict with model_state, model_config, meta)")
    missing = [k for k in ("model_config", "meta") if k not in data]
    if missing:
        raise CheckpointError(f"{path.name} lacks {', '.join(missing)} (kit layout: model_state, model_config, meta)")
    state = data["model_state"]
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise CheckpointError(f"{path.name}: model_state is not a dict of tensors by name")
    for key in ("model_config", "meta"):
        _plain_size(data[key], key)
    extra = sorted(str(k) for k in data if k not in ("model_state", "model_config", "meta"))
    if extra:
        raise CheckpointError(f"{path.name} holds {extra[0][:40]!r} besides model_state, model_config and meta (the kit layout)")
    slack = _storage_slack(state)
    if slack:
        raise CheckpointError(f"{path.name}: the storage of tensor {slack[:80]!r} holds bytes no tensor of model_state covers (slack)")
    params = 0
    non_finite: list[str] = []
    for name, tensor in state.items():
        params += tensor.numel()
        if tensor.is_floating_point() and tensor.numel():
            flat = tensor.reshape(-1)
            step = max(1, _CHUNK_BYTES // max(1, tensor.element_size()))
            for start in range(0, flat.numel(), step):
                if not torch.isfinite(flat[start : start + step]).all():
                    non_finite.append(str(name))
                    break
    return TensorSummary(params=params, tensors=len(state), non_finite=non_finite)


def final_pt_meta(path: Path) -> Any:
    """The ``meta`` a kit-layout final.pt carries (what the run says of itself), read without
    unpickling code and without reading the weights (mmap); None when it has none or does
    not load (the checkpoint check says why)."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - hostile bytes raise anything; the checkpoint check reports it
        return None
    return data.get("meta") if isinstance(data, dict) else None


def first_difference(safetensors_path: Path, final_pt_path: Path) -> str | None:
    """Where ``final.pt``'s model_state and ``model.safetensors`` differ (names, dtype, shape or
    any value, bit for bit), or None when every tensor is the same. Both are read lazily
    (safe_open and an mmap'd weights-only load), one tensor pair at a time."""
    import torch
    from safetensors import safe_open

    state = torch.load(final_pt_path, map_location="cpu", weights_only=True, mmap=True)["model_state"]
    with safe_open(str(safetensors_path), framework="pt") as st:
        names = set(st.keys())
        only_st, only_pt = sorted(names - set(state)), sorted(set(state) - names)
        if only_st or only_pt:
            side, name = ("model.safetensors", only_st[0]) if only_st else ("final.pt", only_pt[0])
            return f"tensor {name!r} is only in {side}"
        for name in sorted(names):
            a, b = st.get_tensor(name), state[name]
            if a.dtype != b.dtype or a.shape != b.shape:
                return f"tensor {name!r} is {b.dtype} {tuple(b.shape)} in final.pt but {a.dtype} {tuple(a.shape)} in model.safetensors"
            if not torch.equal(a, b):
                return f"tensor {name!r} has different values in final.pt and model.safetensors"
    return None
