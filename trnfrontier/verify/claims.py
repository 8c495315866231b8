"""The manifest's ``claimed`` block, read strictly, and the settings a rerun scores at.

A claim never steers the rerun: ``--rerun-eval`` scores the model at the contract's
settings (``RerunSettings``: the evaluation length, the number of tokens and the batch size
of the organisers' public evaluation, or what the verifying user passes on the command
line), and the claim is then compared with that. A claim measured elsewhere (one row, a
shorter length) is refused before anything runs, with both settings named. Every field is
typed and bounded: a ``seq_len`` written as a float or a string, a token count of ``1e999``
or a score of 400 digits is a refusal naming the field, never a conversion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from trnfrontier.runtime import prepare_calls

SPLITS = ("public_val", "val")
MAX_BPB = 100.0  # bits per byte: a uniform guess over 8,192 tokens of one byte each is 13
MAX_TOKENS = 10**10
MAX_SEQ_LEN = 1 << 16
MAX_TEXT = 1000


class ClaimError(ValueError):
    """The claim is refused; the message names the field."""


@dataclass(frozen=True)
class Claim:
    val_bpb: float
    eval_tokens: int
    eval_seq_len: int
    split: str


@dataclass(frozen=True)
class RerunSettings:
    """What the rerun scores: ``tokens`` targets at ``seq_len``, ``batch_size`` rows a call."""

    tokens: int
    seq_len: int
    batch_size: int
    source: str  # "the contract's settings" or "the settings given on the command line"

    @classmethod
    def of(cls, prepare: ModuleType | None, *, tokens: int | None = None, seq_len: int | None = None) -> RerunSettings:
        """The contract's settings (the trusted prepare.py's constants, else the contract's defaults),
        with what the verifying user gave instead."""
        given = tokens is not None or seq_len is not None
        return cls(int(tokens if tokens is not None else prepare_calls.constant(prepare, "EVAL_TOKENS_PUBLIC")),
                   int(seq_len if seq_len is not None else prepare_calls.constant(prepare, "EVAL_SEQ_LEN")),
                   int(prepare_calls.constant(prepare, "EVAL_BATCH_SIZE")),
                   "the settings given on the command line" if given else "the contract's settings")

    def describe(self) -> str:
        return f"{self.tokens:,} tokens at seq {self.seq_len}"


def _integer(block: dict[str, Any], key: str, low: int, high: int) -> int:
    value = block.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClaimError(f"claimed.{key} is {_kind(value)}, expected an integer")
    if not low <= value <= high:
        raise ClaimError(f"claimed.{key} is {value}, outside {low}..{high:,}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "missing"
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def parse_claim(claimed: Any) -> Claim:
    """The claim in ``manifest["claimed"]``, or ClaimError naming the field that is wrong."""
    if not isinstance(claimed, dict):
        raise ClaimError(f"claimed is {_kind(claimed)}, expected an object with val_bpb, eval_tokens and eval_seq_len")
    bpb = claimed.get("val_bpb")
    if isinstance(bpb, bool) or not isinstance(bpb, (int, float)):
        raise ClaimError(f"claimed.val_bpb is {_kind(bpb)}, expected a number")
    if not math.isfinite(float(bpb)) or not 0.0 < float(bpb) <= MAX_BPB:
        raise ClaimError(f"claimed.val_bpb is {bpb!r}, outside (0, {MAX_BPB:g}]")
    split = claimed.get("split", "public_val")
    if not isinstance(split, str) or split not in SPLITS:
        raise ClaimError(f"claimed.split is {_kind(split)}, not the public validation split ({' or '.join(SPLITS)})")
    measured = claimed.get("measured_by")
    if measured is not None and (not isinstance(measured, str) or len(measured) > MAX_TEXT):
        raise ClaimError(f"claimed.measured_by is {_kind(measured)}, expected text of at most {MAX_TEXT} characters")
    return Claim(float(bpb), _integer(claimed, "eval_tokens", 1, MAX_TOKENS), _integer(claimed, "eval_seq_len", 1, MAX_SEQ_LEN), split)


def settings_mismatch(claim: Claim, settings: RerunSettings) -> str | None:
    """Why the claim cannot be compared with a rerun at ``settings``, or None."""
    if (claim.eval_tokens, claim.eval_seq_len) == (settings.tokens, settings.seq_len):
        return None
    return (f"the claim was measured on {claim.eval_tokens:,} tokens at seq {claim.eval_seq_len}; the rerun scores "
            f"{settings.describe()} ({settings.source}): measure the claim there "
            f"(trnf eval --tokens {settings.tokens} --seq-len {settings.seq_len}), or verify locally with "
            f"--eval-tokens {claim.eval_tokens} --eval-seq-len {claim.eval_seq_len}")
