"""Size and SHA256 of the files of a checkpoint directory, recorded when it is written and
checked when it is read, so a flipped byte or a cut file is refused instead of changing
a score in silence.

Every checkpoint directory (``checkpoints/step_XXXXXX/``, ``final/``) holds a
``manifest.json`` (``rundir.MANIFEST_FILE``)::

    {"format": "trnfrontier-manifest/1", "files": {"model.safetensors": {"size": N, "sha256": "..."}, ...}}

written inside the same temporary directory as the files and renamed into place with them
(``atomic.write_directory``), so a manifest never describes other files than its own.
Runtime layer: standard library only (a packaged train.py carries this module).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from trnfrontier.runtime.atomic import json_bytes
from trnfrontier.runtime.rundir import KIT_FILE, MANIFEST_FILE, META_FILE, MODEL_FILE

MANIFEST_FORMAT = "trnfrontier-manifest/1"
# What meta.json says in every checkpoint directory `trnf train` writes (runtime/checkpoint.py).
CHECKPOINT_FORMAT = "trnfrontier-checkpoint/1"
_HASH_BLOCK = 1 << 20


class DamagedFileError(ValueError):
    """A file differs from the size or SHA256 its manifest recorded (or the manifest is
    unreadable). The message is one line naming the file; callers append the repair."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path} is damaged ({problem})")
        self.path = path
        self.problem = problem


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def describe_files(directory: Path) -> dict[str, Any]:
    """The manifest document of every file in ``directory`` (read back from disk, so it
    records what was written, not what was meant to be)."""
    names = sorted(p.name for p in Path(directory).iterdir() if p.is_file() and p.name != MANIFEST_FILE)
    files = {name: {"size": (directory / name).stat().st_size, "sha256": file_sha256(directory / name)} for name in names}
    return {"format": MANIFEST_FORMAT, "files": files}


def write_manifest(directory: Path) -> None:
    """Write ``directory``'s manifest.json (call before the directory is renamed into place)."""
    with open(Path(directory) / MANIFEST_FILE, "wb") as handle:
        handle.write(json_bytes(describe_files(Path(directory))))
        handle.flush()
        os.fsync(handle.fileno())


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The files a directory's manifest lists, or None when it has none (a checkpoint
    written before manifests existed, or someone else's final.pt)."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        files = document["files"]
        for entry in files.values():
            if not isinstance(entry["size"], int) or not isinstance(entry["sha256"], str):
                raise TypeError("an entry has no integer size and string sha256")
        return dict(files)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DamagedFileError(path, f"unreadable manifest: {exc}") from None


def check_file(path: Path, *, full: bool = True) -> bool:
    """Check ``path`` against the manifest of its directory: the size always, the SHA256
    when ``full``. True when a manifest listed it, False when nothing records it."""
    path = Path(path)
    files = read_manifest(path.parent)
    if files is None or path.name not in files:
        return False
    expected = files[path.name]
    try:
        size = path.stat().st_size
    except OSError:
        raise DamagedFileError(path, "missing, though its manifest lists it") from None
    if size != expected["size"]:
        raise DamagedFileError(path, f"{size:,} bytes, its manifest says {expected['size']:,}")
    if full and file_sha256(path) != expected["sha256"]:
        raise DamagedFileError(path, "its SHA256 differs from the one recorded when it was written")
    return True


def check_directory(directory: Path, *, full: bool = True) -> bool:
    """Check every file a checkpoint directory's manifest lists. True when it has one."""
    files = read_manifest(directory)
    if files is None:
        return False
    for name in sorted(files):
        check_file(Path(directory) / name, full=full)
    return True


def _written_by_trnf(directory: Path) -> bool:
    """Whether ``directory`` is a checkpoint directory `trnf train` wrote (its meta.json
    says so): such a directory always has a manifest, so one without it lost it."""
    try:
        meta = json.loads((Path(directory) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == CHECKPOINT_FORMAT


def check_weights(weights: Path) -> str | None:
    """Every file a score reads from a checkpoint, checked strictly before it is read: the
    weights (``model.safetensors`` or ``final.pt``) and the ``meta.json`` beside them,
    against the manifest of their directory. Returns what was checked against (a phrase
    for the user), or None when nothing records the file (a kit's own final.pt).

    Stricter than ``read_model_file`` (which a submission's load_for_eval runs, and which
    must load a final.pt copied without its manifest): a directory `trnf train` wrote that
    lost its manifest is refused, since nothing then vouches for its bytes."""
    weights = Path(weights)
    directory = weights.parent
    manifest = directory / MANIFEST_FILE
    files = read_manifest(directory)
    if files is None:
        if weights.name in (MODEL_FILE, KIT_FILE) and _written_by_trnf(directory):
            raise DamagedFileError(manifest, f"missing, so {weights.name} beside it cannot be checked")
        return None
    if weights.name not in files:
        raise DamagedFileError(weights, f"{manifest} does not list it")
    check_file(weights)
    if META_FILE in files:
        check_file(directory / META_FILE)
    return f"size and SHA256 checked against {manifest}"


def check_recorded_sha256(path: Path, sha256: str, recorded_in: Path) -> None:
    """``path`` against a SHA256 a run recorded elsewhere (a kit run's summary.json)."""
    try:
        actual = file_sha256(Path(path))
    except OSError as exc:
        raise DamagedFileError(Path(path), f"unreadable ({exc.strerror or exc}), though {recorded_in} records it") from None
    if actual != sha256:
        raise DamagedFileError(Path(path), f"its SHA256 differs from the one {recorded_in} recorded when the run wrote it")
