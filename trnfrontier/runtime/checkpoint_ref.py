"""What a checkpoint path names, resolved one way everywhere.

``trnf eval PATH`` (for the settings and SHA256s recorded with the checkpoint), its
evaluation worker and ``load_for_eval`` (for the weights) all take the same kinds of
path: a run directory, a checkpoint directory (``final/``, ``checkpoints/step_XXXXXX/``),
``model.safetensors`` or ``final.pt``. ``resolve_checkpoint`` turns any of them into a
``CheckpointRef``: the file holding the weights, the ``meta.json`` beside it and the
run directory it belongs to. Standard library only (no torch), so the tool can resolve a
path without loading anything.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnfrontier.runtime.integrity import DamagedFileError, check_directory
from trnfrontier.runtime.rundir import (
    CHECKPOINTS_DIR,
    FINAL_DIR,
    KIT_FILE,
    MANIFEST_FILE,
    META_FILE,
    MODEL_FILE,
    OPTIM_FILE,
    STATE_FILE,
    SUMMARY_FILE,
)

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
# How far above the weights file to look for the run's summary.json (final/final.pt is
# one level down, checkpoints/step_XXXXXX/model.safetensors two).
_RUN_DIR_LEVELS = 4


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete resumable checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if (
            match
            and child.is_dir()
            and all((child / f).is_file() for f in (MODEL_FILE, META_FILE, OPTIM_FILE, STATE_FILE))
        ):
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def check_resumable(checkpoint_dir: Path) -> None:
    """Every file of a resumable checkpoint against its manifest (size and SHA256): a
    damaged one is refused, naming the checkpoint to fall back to."""
    try:
        if not check_directory(checkpoint_dir):  # trnf writes one with every checkpoint
            raise DamagedFileError(checkpoint_dir / MANIFEST_FILE, "missing, so the checkpoint's files cannot be checked")
    except DamagedFileError as exc:
        run_dir = checkpoint_dir.parent.parent
        earlier = [p for p in list_checkpoints(run_dir) if p.name < checkpoint_dir.name]
        fix = (
            f"delete {checkpoint_dir} and resume again to continue from {earlier[-1].name}"
            if earlier
            else "no earlier checkpoint exists; start the run again"
        )
        raise DamagedFileError(exc.path, f"{exc.problem}; refusing to resume from it: {fix}") from None


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


@dataclass(frozen=True)
class CheckpointRef:
    path: Path  # as given
    model_file: Path  # model.safetensors or final.pt: the weights

    @property
    def meta_file(self) -> Path:
        """meta.json beside the weights (written with every trnf checkpoint)."""
        return self.model_file.with_name(META_FILE)

    def meta(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.meta_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    @property
    def run_dir(self) -> Path | None:
        """The run directory the weights belong to (the nearest holding summary.json)."""
        start = self.model_file.parent
        for candidate in (start, *list(start.parents)[: _RUN_DIR_LEVELS - 1]):
            if (candidate / SUMMARY_FILE).is_file():
                return candidate
        return None

    @property
    def is_final(self) -> bool:
        """Whether these are the run's final weights (the ones its summary's val_bpb scores)."""
        run_dir = self.run_dir
        return run_dir is not None and self.model_file.parent.resolve() == (run_dir / FINAL_DIR).resolve()


def resolve_checkpoint(path: str | os.PathLike[str]) -> CheckpointRef:
    """A run dir, checkpoint dir, model.safetensors or final.pt -> its CheckpointRef.

    In a directory: its own weights, else ``final/``'s, else the latest complete
    resumable checkpoint's. Raises FileNotFoundError naming what is missing."""
    given = Path(path)
    if given.is_file():
        return CheckpointRef(given, given)
    if not given.is_dir():
        raise FileNotFoundError(f"{given}: no such checkpoint file or directory")
    for candidate in (
        given / MODEL_FILE,
        given / KIT_FILE,
        given / FINAL_DIR / MODEL_FILE,
        given / FINAL_DIR / KIT_FILE,
    ):
        if candidate.is_file():
            return CheckpointRef(given, candidate)
    latest = latest_checkpoint(given)
    if latest is not None:
        return CheckpointRef(given, latest / MODEL_FILE)
    raise FileNotFoundError(
        f"{given}: holds no model.safetensors, final.pt, final/ or checkpoints/step_*/"
    )
