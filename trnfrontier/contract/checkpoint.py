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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trnfrontier.contract.jsonstrict import StrictJSONError, strict_loads
from trnfrontier.contract.kit import CHECKPOINT as KIT_CHECKPOINT

_CHUNK_BYTES = 16 << 20
_MAX_HEADER_BYTES = 100 << 20

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


def find_checkpoint(root: Path, *, since: float | None = None, exclude: Path | None = None) -> Path | None:
    """The checkpoint a run wrote under ``root`` (a kit script's directory, a dry run's copy of it):
    the kit's ``out/final.pt``, else the newest ``*.pt`` at most ``SEARCH_DEPTH`` levels deep,
    outside hidden folders and ``exclude`` (trnf's own run directory when it lies under
    ``root``). With ``since``, only files written at or after it (not a previous run's)."""

    def fresh(path: Path) -> bool:
        return path.is_file() and (since is None or path.stat().st_mtime >= since)

    kit = root / KIT_CHECKPOINT
    if fresh(kit):
        return kit
    found: list[Path] = []
    for depth in range(1, SEARCH_DEPTH + 1):
        for path in root.glob("/".join(["*"] * depth) + ".pt"):
            hidden = any(part.startswith(".") for part in path.relative_to(root).parts)
            if not hidden and (exclude is None or exclude not in path.parents) and fresh(path):
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
        header.pop("__metadata__", None)
        data_start = 8 + header_len
        data_len = size - data_start
        spans: list[tuple[int, int, str, dict[str, Any]]] = []
        for name, info in header.items():
            try:
                dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(f"{path.name}: tensor {name!r} has a malformed entry") from None
            if dtype not in _DTYPES:
                raise CheckpointError(f"{path.name}: tensor {name!r} has unknown dtype {dtype!r}")
            if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
                raise CheckpointError(f"{path.name}: tensor {name!r} has a bad shape {shape!r}")
            if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= data_len):
                raise CheckpointError(f"{path.name}: tensor {name!r} points outside the file")
            if end - begin != _count(shape) * _DTYPES[dtype][0]:
                raise CheckpointError(f"{path.name}: tensor {name!r} byte span does not match its shape and dtype")
            spans.append((begin, end, name, info))
        spans.sort()
        for (_, prev_end, prev, _), (begin, _, name, _) in zip(spans, spans[1:], strict=False):
            if begin < prev_end:
                raise CheckpointError(f"{path.name}: tensors {prev!r} and {name!r} overlap")
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


def scan_final_pt(path: Path) -> TensorSummary:
    """Load the kit-layout final.pt without unpickling code and scan its model_state."""
    import torch

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
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path.name}: model_state is not a dict of tensors")
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
