"""CORE as one piece of a ``trnf eval`` worker's job: what the parent decided, what the
worker runs.

``trnf eval --core`` resolves the bundle once, in the parent (download, pin, unzip, every
task file read and checked), before any model is loaded; each worker process (or each
rank of a torchrun of workers) receives a ``CoreJob`` inside its ``WorkerSpec`` and
scores its model with ``run.run_job``. This module imports no torch: the parent needs
none to check a bundle.

The crop length rule: the model's ``max_seq_len`` when it declares one (what nanochat
crops at); else ``--seq-len``; else the run's training context (its recipe's
``model.sequence_len``); else the contract's evaluation length. The report names which.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.evaluate.core import fetch
from trnfrontier.evaluate.core.fetch import ResolvedBundle

# Padded tokens per forward: large enough for efficient matmuls, small enough for memory.
DEFAULT_BATCH_TOKENS = 8192


@dataclass(frozen=True)
class CoreJob:
    bundle_root: str  # the checked, unpacked bundle folder
    bundle_sha256: str
    bundle_sha256_of: str
    bundle_source: str
    bundle_pinned: bool
    format_sample: bool
    crop: int | None  # before the model's own max_seq_len, which wins
    crop_source: str
    max_per_task: int | None = None
    batch_tokens: int = DEFAULT_BATCH_TOKENS

    @classmethod
    def of(cls, resolved: ResolvedBundle, crop: int | None, crop_source: str, **options: Any) -> CoreJob:
        return cls(
            bundle_root=str(resolved.bundle.root),
            bundle_sha256=resolved.sha256,
            bundle_sha256_of=resolved.sha256_of,
            bundle_source=resolved.source,
            bundle_pinned=resolved.pinned,
            format_sample=resolved.sample,
            crop=crop,
            crop_source=crop_source,
            **options,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class CoreSetup:
    """The parent's half: a checked bundle and the options every target is scored with."""

    resolved: ResolvedBundle
    max_per_task: int | None
    batch_tokens: int
    items: int  # items one model is scored on

    def job(self, seq_len: int | None, train_seq_len: int | None, contract_seq_len: int) -> dict[str, Any]:
        """The ``CoreJob`` of one target (as a dict), with its crop length and its source."""
        if seq_len is not None:
            crop, source = seq_len, "--seq-len"
        elif train_seq_len is not None:
            crop, source = train_seq_len, "the run's training context (recipe model.sequence_len)"
        else:
            crop, source = contract_seq_len, "contract EVAL_SEQ_LEN"
        job = CoreJob.of(self.resolved, crop, source, max_per_task=self.max_per_task, batch_tokens=self.batch_tokens)
        return job.to_dict()


def prepare_core(bundle: str | None, pin: str | None, max_per_task: int | None, batch_tokens: int = DEFAULT_BATCH_TOKENS) -> CoreSetup:
    """Resolve and check the whole bundle (every item of every task) before any model loads."""
    resolved = fetch.resolve(bundle, pin)
    total = 0
    for task in resolved.bundle.tasks:
        count = len(resolved.bundle.items(task))
        scored = min(count, max_per_task) if max_per_task else count
        if task.num_fewshot >= scored:
            raise TrnfError(
                f"task {task.label!r} is {task.num_fewshot}-shot but would score {scored} item(s): each item's shots "
                f"come from the others; raise --max-per-task above {task.num_fewshot}"
            )
        total += scored
    return CoreSetup(resolved, max_per_task, batch_tokens, total)


BATCH_TOKENS_FLAG = "--core-batch-tokens"


def core_from_flags(
    core: bool, bundle: str | None, pin: str | None, max_per_task: int | None,
    names: tuple[str, str, str] = ("--bundle", "--bundle-sha256", "--max-per-task"),
    batch_tokens: int | None = None,
) -> CoreSetup | None:
    """The command line's ``--core`` flags (`trnf eval`, `trnf verify`; ``names`` as that
    command spells them) as a checked bundle, or None without ``--core``. ``batch_tokens``
    is `trnf eval`'s ``--core-batch-tokens`` (None: the default)."""
    if not core:
        given = [name for name, value in zip(names, (bundle, pin, max_per_task), strict=True) if value]
        given += [BATCH_TOKENS_FLAG] if batch_tokens is not None else []
        if given:
            raise UsageError(f"{', '.join(given)} go(es) with --core")
        return None
    return prepare_core(bundle, pin, max_per_task, batch_tokens or DEFAULT_BATCH_TOKENS)
