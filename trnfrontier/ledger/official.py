"""The offset between a team's local public score and the leaderboard's, with its
uncertainty, and the projected official score of any local one.

The leaderboard scores about 20M tokens of a private shard; the local public score 2M
tokens of the public one. Teams found the two differ by a roughly constant offset. From
recorded pairs (local, official) this fits ``official = local + offset``: the offset is
the mean difference and a projection carries a t prediction interval,
``t(n-1) * sd * sqrt(1 + 1/n)``, which covers both the offset's own uncertainty and the
pair-to-pair scatter. One pair gives an offset with unknown uncertainty; none, nothing.
Pairs are kept apart by the local score's setting (tokens, sequence length): an offset
measured on one setting says nothing about another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trnfrontier import stats


@dataclass(frozen=True)
class OffsetFit:
    """official = local + offset, from ``n`` pairs recorded at one local setting."""

    n: int
    offset: float
    sd: float | None  # scatter of (official - local) between pairs; None for one pair
    num_tokens: int | None
    seq_len: int | None
    confidence: float = 0.95

    @property
    def offset_half_width(self) -> float | None:
        if self.sd is None:
            return None
        return stats.t_critical(self.confidence, self.n - 1) * self.sd / math.sqrt(self.n)

    @property
    def prediction_half_width(self) -> float | None:
        """Half width of the interval for one new run's official score."""
        if self.sd is None:
            return None
        return stats.t_critical(self.confidence, self.n - 1) * self.sd * math.sqrt(1 + 1 / self.n)

    def to_json(self) -> dict[str, Any]:
        return {
            "pairs": self.n,
            "offset": self.offset,
            "offset_half_width": self.offset_half_width,
            "sd": self.sd,
            "prediction_half_width": self.prediction_half_width,
            "local_num_tokens": self.num_tokens,
            "local_seq_len": self.seq_len,
            "confidence": self.confidence,
        }


def pairs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every recorded (local, official) pair across the ledger, with its run's name."""
    return [{**o, "name": run["name"]} for run in runs for o in run.get("official", [])]


def fit_offsets(runs: list[dict[str, Any]], confidence: float = 0.95) -> dict[tuple[Any, Any], OffsetFit]:
    """One fit per local setting (tokens, seq_len) that has pairs."""
    grouped: dict[tuple[Any, Any], list[float]] = {}
    for pair in pairs(runs):
        key = (pair.get("local_num_tokens"), pair.get("local_seq_len"))
        grouped.setdefault(key, []).append(float(pair["official"]) - float(pair["local_val_bpb"]))
    fits = {}
    for key, diffs in grouped.items():
        summary = stats.describe(diffs)
        fits[key] = OffsetFit(summary.n, summary.mean, summary.sd, key[0], key[1], confidence)
    return fits


def project(
    score: dict[str, Any] | None, fits: dict[tuple[Any, Any], OffsetFit]
) -> tuple[float, float | None] | None:
    """(projected official score, half width or None) for a local score, or None when no
    pair was recorded at that score's setting."""
    if score is None:
        return None
    fit = fits.get((score.get("num_tokens"), score.get("seq_len")))
    if fit is None:
        return None
    return float(score["val_bpb"]) + fit.offset, fit.prediction_half_width


def no_pairs_line() -> str:
    return (
        "no official scores recorded, so no projection: after an upload, "
        "`trnf runs record-official RUN SCORE` pairs the leaderboard's number with the run's local one"
    )
