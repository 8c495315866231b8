"""Which of a run's scores stands for it, and when two scores are comparable at all.

A run may hold several scores: the trainer's final one, and any `trnf eval` after it
(more tokens, another context). Two scores are comparable only when they measured the
same thing: same split, token count, sequence length, prepare.py, tokenizer and
validation data. Different numbers of any of those are different questions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# What a score measured: the fields that must agree before two scores are compared.
SETTING_FIELDS = ("split", "num_tokens", "seq_len", "prepare_sha256", "tokenizer_sha256", "data_id")
FIELD_NAMES = {
    "split": "validation split",
    "num_tokens": "evaluation tokens (asked for)",
    "seq_len": "sequence length",
    "prepare_sha256": "prepare.py SHA256",
    "tokenizer_sha256": "tokenizer SHA256",
    "data_id": "validation data",
}


def primary_score(
    run: dict[str, Any], tokens: int | None = None, seq_len: int | None = None
) -> dict[str, Any] | None:
    """The valid score that stands for ``run``: the latest one with ``tokens`` and
    ``seq_len`` when given; otherwise the trainer's own (the run's own settings), else the
    latest `trnf eval` one. None when the run has no such score."""
    valid = [
        s
        for s in run.get("scores", [])
        if s.get("status") in (None, "ok")
        and (tokens is None or s.get("num_tokens") == tokens)
        and (seq_len is None or s.get("seq_len") == seq_len)
    ]
    if not valid:
        return None
    if tokens is None and seq_len is None:
        trained = [s for s in valid if s.get("source") == "train"]
        if trained:
            return trained[-1]
    return max(valid, key=lambda s: s.get("recorded") or 0.0)


# CORE (`trnf eval --core`) is recorded in the same line as that eval's val_bpb; two CORE
# scores are comparable with the same bundle, subsample, crop length and tokenizer.
CORE = "core"
CORE_SETTING_FIELDS = ("core_bundle_sha256", "core_max_per_task", "core_crop", "tokenizer_sha256")
FIELD_NAMES.update({
    "core_bundle_sha256": "CORE bundle SHA256",
    "core_max_per_task": "CORE items per task (--max-per-task)",
    "core_crop": "CORE crop length",
})  # fmt: skip


def core_score(run: dict[str, Any]) -> dict[str, Any] | None:
    """The latest valid CORE score of ``run`` (None: never scored with --core)."""
    valid = [s for s in run.get("scores", []) if s.get("status") in (None, "ok") and isinstance(s.get(CORE), (int, float))]
    return max(valid, key=lambda s: s.get("recorded") or 0.0) if valid else None


def describe_core_setting(score: dict[str, Any]) -> str:
    bundle = str(score.get("core_bundle_sha256") or "?")[:12]
    subset = score.get("core_max_per_task")
    items = f"at most {subset} items per task" if subset else "every item"
    return f"bundle {bundle}, {items}, crop {score.get('core_crop') or '?'}"


def setting(score: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(score.get(name) for name in SETTING_FIELDS)


def describe_setting(score: dict[str, Any]) -> str:
    tokens = score.get("num_tokens")
    shown = f"{tokens:,}" if isinstance(tokens, int) else "?"
    return f"{score.get('split') or '?'}, {shown} tokens, seq_len {score.get('seq_len') or '?'}"


def first_difference(a: dict[str, Any], b: dict[str, Any], fields: tuple[str, ...] = SETTING_FIELDS) -> str | None:
    """The first setting field on which two scores differ, in words; None when comparable."""
    for name in fields:
        if a.get(name) != b.get(name):
            return FIELD_NAMES[name]
    return None


@dataclass(frozen=True)
class Metric:
    """What `trnf compare --metric` compares: the value, its direction, the score that
    stands for a run, and the settings two scores must share."""

    name: str
    higher_is_better: bool
    fields: tuple[str, ...]
    pick: Callable[[dict[str, Any], int | None, int | None], dict[str, Any] | None]
    describe: Callable[[dict[str, Any]], str]
    rescore: str  # how to score runs alike, for the refusal message


METRICS = {
    "val_bpb": Metric("val_bpb", False, SETTING_FIELDS, primary_score, describe_setting,
                      "score them alike with `trnf eval RUN --tokens N --seq-len L`, then compare with --tokens N --seq-len L"),
    CORE: Metric(CORE, True, CORE_SETTING_FIELDS, lambda run, _tokens, _seq_len: core_score(run), describe_core_setting,
                 "score them alike with `trnf eval RUN --core --bundle B --bundle-sha256 S` (same --seq-len, --max-per-task)"),
}  # fmt: skip
