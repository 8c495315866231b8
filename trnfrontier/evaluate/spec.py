"""What one evaluation worker runs with: ``trnf eval`` builds it, ``evaluate.worker`` reads it.

It crosses a process boundary as JSON (the worker's one argument); both sides use this
dataclass, so a key cannot be spelt one way here and another way there.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerSpec:
    path: str  # what the user named (the checkpoint, for a trnf checkpoint)
    train_py: str | None  # a kit train.py whose load_for_eval loads ``checkpoint``
    checkpoint: str | None
    tokens: int
    tokens_source: str  # where each setting came from, for the report
    seq_len: int
    seq_len_source: str
    batch_size: int
    device: str
    timeout: float  # evaluate_bpb's own timeout; the worker is killed LOAD_GRACE later
    allow_mismatch: bool
    sample_tokens: int
    prompt: str
    temperature: float
    threads: int | None
    recorded_val_bpb: float | None  # the run's summary score of these weights, to compare
    recorded_shas: dict[str, Any] | None  # kit checkpoints: SHA256s from a meta.json beside
    seed: int = 0  # sampling
    nproc: int = 1  # processes (torchrun) sharing CORE's items and the validation rows
    core: dict[str, Any] | None = None  # evaluate.core.job.CoreJob.to_dict(): also score CORE
    progress_file: str | None = None  # where the worker writes its progress for the parent
    # Phase 2: CORE runs through this inference.py (a Phase 2 run's: the one trnf writes;
    # a kit train.py's: the inference.py beside it), not the model's forward.
    inference_py: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        """Raises ValueError naming an unknown or missing key."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the worker spec is not a JSON object")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown worker spec key {unknown[0]!r}")
        return cls(**data)
