"""The submission archive format (`trnf-submission/1`), shared by `trnf package` and `trnf verify`.

An archive is a plain (optionally gzip-compressed) POSIX tar whose members are regular
files with normalised relative names (no ``./`` prefix, no ``..``, no absolute paths,
no links, no device files). Directory entries are tolerated but not needed.

Layout::

    train.py                       the training script; defines load_for_eval(checkpoint_path, device)
    launch.txt                     one line: NEURON_LOGICAL_NC_CONFIG=<1|2> torchrun --standalone
                                   --nproc_per_node=<1|4|8> train.py
    inference.py                   Phase 2: the wrapper the organisers run CORE through
                                   (load_model, next_token_logprobs; docs/phase2.md)
    kernels/*.py                   optional: NKI kernel files train.py uses
    runtime/**.py, <name>.py, ...  optional: any other .py file train.py imports
                                   (the trnfrontier runtime shipped beside it)
    checkpoint/model.safetensors   the consolidated final weights
    checkpoint/meta.json           what the checkpoint is (config, step, tokens, ...)
    checkpoint/final.pt            the kit's layout: {"model_state", "model_config", "meta"}
                                   (torch.save; loadable with weights_only=True)
    WRITEUP.md                     the write-up
    loss_curve.png                 optional
    logs/metrics.jsonl             one JSON object per logged step
    logs/summary.json              the run summary
    logs/step_boundaries.jsonl     what prepare.record_step_boundary wrote
    manifest.json                  see below; the only member not listed in itself

``load_for_eval`` receives the path of ``checkpoint/final.pt`` (as the organisers'
``eval-public --checkpoint`` does); a train.py may read the sibling files of that path.

manifest.json::

    {"format": "trnf-submission/1",
     "files": {"<member>": {"size": int, "sha256": hex}, ...},   every member but manifest.json
     "prepare_sha256": hex, "tokenizer_sha256": hex,
     "claimed": {"val_bpb": float, "eval_tokens": int, "eval_seq_len": int,
                 "split": "public_val", "measured_by": str},
     "params": int,                                             parameters in model.safetensors
     "versions": {"python", "torch", "torch_neuronx", "trnf"},
     "git": {"commit": str | null, "dirty": bool | null},
     "seed": int, "launch": str, "forced": [str, ...],          reasons --force overrode
     "phase": 2}                                               only for Phase 2 (absent: Phase 1)

Determinism: ``write_deterministic_tar`` sorts members by name and fixes mtime (0),
owner (uid/gid 0, no names) and modes (0644 files), so the same inputs give the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from trnfrontier.contract.kit import LAUNCH_FILE
from trnfrontier.runtime.atomic import DiskFullError, fsync_dir, is_disk_full

FORMAT = "trnf-submission/1"

TRAIN_PY = "train.py"
INFERENCE_PY = "inference.py"  # Phase 2 (contract.phases: inference_py)
MANIFEST = "manifest.json"
WRITEUP = "WRITEUP.md"
LOSS_CURVE = "loss_curve.png"
CHECKPOINT_SAFETENSORS = "checkpoint/model.safetensors"
CHECKPOINT_META = "checkpoint/meta.json"
CHECKPOINT_FINAL_PT = "checkpoint/final.pt"
METRICS_LOG = "logs/metrics.jsonl"
SUMMARY = "logs/summary.json"
STEP_LOG = "logs/step_boundaries.jsonl"

# load_for_eval is handed this member's path, like the organisers' `--checkpoint out/final.pt`.
EVAL_CHECKPOINT = CHECKPOINT_FINAL_PT

REQUIRED_MEMBERS: tuple[str, ...] = (
    TRAIN_PY,
    LAUNCH_FILE,
    CHECKPOINT_SAFETENSORS,
    CHECKPOINT_META,
    CHECKPOINT_FINAL_PT,
    WRITEUP,
    METRICS_LOG,
    SUMMARY,
    STEP_LOG,
    MANIFEST,
)
OPTIONAL_MEMBERS: tuple[str, ...] = (LOSS_CURVE,)

# The organisers' upload portal refuses any single file larger than this.
PORTAL_FILE_LIMIT_BYTES = 262_144

# Code directories whose .py files must never be confused with data.
_DATA_DIRS = ("checkpoint/", "logs/")
_NAME_PART = re.compile(r"^[A-Za-z0-9_.\-]+$")


def is_normalised_name(name: str) -> bool:
    """A member name in canonical form: relative, '/'-separated, no '.', '..' or empty parts."""
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return False
    parts = name.split("/")
    return all(part not in ("", ".", "..") and _NAME_PART.match(part) for part in parts)


def is_allowed_member(name: str) -> bool:
    """Whether ``name`` may appear in an archive of this format."""
    if name in REQUIRED_MEMBERS or name in OPTIONAL_MEMBERS:
        return True
    # Any other Python file is allowed as code train.py may import (kernels/, runtime/,
    # top-level helpers), but not hidden among the checkpoint or the logs.
    return name.endswith(".py") and not name.startswith(_DATA_DIRS) and is_normalised_name(name)


def code_members(names: list[str] | set[str]) -> list[str]:
    """The members a screen and the portal size limit apply to: every .py file and launch.txt."""
    return sorted(n for n in names if n.endswith(".py") or n == LAUNCH_FILE)


def file_entry(path: Path, chunk_size: int = 1 << 20) -> dict[str, Any]:
    """``{"size", "sha256"}`` of one file, read in chunks (flat memory for big checkpoints)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
            size += len(block)
    return {"size": size, "sha256": digest.hexdigest()}


def bytes_entry(data: bytes) -> dict[str, Any]:
    """``{"size", "sha256"}`` of in-memory member content."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def build_manifest(files: Mapping[str, Path | bytes], **meta: Any) -> dict[str, Any]:
    """The manifest for ``files`` (member name -> local path or content) plus the metadata fields.

    ``meta`` carries the other top-level keys (``prepare_sha256``, ``tokenizer_sha256``,
    ``claimed``, ``params``, ``versions``, ``git``, ``seed``, ``launch``, ``forced``).
    """
    bad = [name for name in files if name == MANIFEST or not is_allowed_member(name)]
    if bad:
        raise ValueError(f"not allowed in a {FORMAT} archive: {', '.join(sorted(bad))}")
    manifest: dict[str, Any] = {"format": FORMAT}
    manifest["files"] = {
        name: bytes_entry(bytes(src)) if isinstance(src, (bytes, bytearray)) else file_entry(Path(src))
        for name, src in sorted(files.items())
    }
    manifest.update(meta)
    manifest.setdefault("forced", [])
    return manifest


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """Canonical JSON for manifest.json (sorted keys), so archives stay byte-identical."""
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


def canonical_header(name: str, size: int) -> bytes:
    """The exact header bytes ``write_deterministic_tar`` writes for a member (verify compares against them)."""
    return _tarinfo(name, size).tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def write_deterministic_tar(members: Mapping[str, Path | bytes], out_path: Path) -> None:
    """Write ``members`` (name -> file path or bytes) as an uncompressed tar at ``out_path``.

    Members are sorted, with mtime 0, uid/gid 0 and mode 0644, in PAX format; the file is
    written beside ``out_path``, fsynced and renamed into place, so nothing half-written is
    left. A full disk raises ``DiskFullError`` saying how much the archive needs.
    """
    for name in members:
        if not is_normalised_name(name):
            raise ValueError(f"member name {name!r} is not a normalised relative path")
    out_path = Path(out_path)
    partial = out_path.with_name(out_path.name + ".partial")
    try:
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(members):
                source = members[name]
                if isinstance(source, (bytes, bytearray)):
                    tar.addfile(_tarinfo(name, len(source)), io.BytesIO(source))
                else:
                    with open(source, "rb") as handle:
                        tar.addfile(_tarinfo(name, os.fstat(handle.fileno()).st_size), handle)
        with open(partial, "rb+") as written:
            os.fsync(written.fileno())
        os.replace(partial, out_path)
        fsync_dir(out_path.parent)
    except OSError as exc:
        if not is_disk_full(exc):
            if exc.filename is not None and os.fspath(exc.filename) == os.fspath(partial):
                # The user named out_path (-o); the temporary name beside it is ours.
                raise OSError(exc.errno, exc.strerror, str(out_path)) from None
            raise
        partial.unlink(missing_ok=True)
        raise DiskFullError(out_path, _tar_size(members), "the archive") from None
    finally:
        if partial.exists():
            partial.unlink()


def _tar_size(members: Mapping[str, Path | bytes]) -> int:
    """About what the tar of ``members`` takes: data rounded up to 512-byte blocks, plus a
    header block (and a PAX one) per member and the end-of-archive blocks."""
    total = 2 * 512
    for source in members.values():
        size = len(source) if isinstance(source, (bytes, bytearray)) else Path(source).stat().st_size
        total += 3 * 512 + -(-size // 512) * 512
    return total


def member_path(root: Path, name: str) -> Path:
    """Where member ``name`` lives under an extraction root."""
    return root.joinpath(*PurePosixPath(name).parts)
