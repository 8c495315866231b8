"""Verdicts from per-position losses and predictions, as nanochat decides them.

- multiple choice and schema: each option's mean loss over its scored tokens (a float32
  ``torch.mean`` of the losses in order, then a Python float); the prediction is
  ``means.index(min(means))``, so an exact tie goes to the first option and a NaN mean
  (an option with no scored token) behaves as it does under Python's ``min``;
- language modeling: correct when every scored token is the greedy prediction.

A near-tie is an item whose verdict a change of the logits at the level that padding or
batching causes (~1e-6 in float32) could flip: another option's mean loss within the
tolerance of the chosen one's (options that are the same row are exactly tied and stay
so), or, for language modeling, a deciding position whose two largest logits are that
close. They are counted, not excluded: the verdict is still nanochat's rule on these
numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from trnfrontier.evaluate.core.batching import Row
from trnfrontier.evaluate.core.sequences import ItemRows

# Relative to the magnitude of the value compared (at least 1): float32 logits and losses
# move by ~1e-6 with padding and batch shape; bfloat16 or float16 ones by ~1e-2.
FLOAT32_TOLERANCE = 1e-4
LOW_PRECISION_TOLERANCE = 3e-2


def tolerance_for(dtype: torch.dtype) -> float:
    return FLOAT32_TOLERANCE if dtype in (torch.float32, torch.float64) else LOW_PRECISION_TOLERANCE


@dataclass(frozen=True)
class RowScores:
    """A row's outputs at its scored positions, in order."""

    loss: Tensor
    argmax: Tensor
    margin: Tensor | None


@dataclass(frozen=True)
class Verdict:
    correct: bool
    near_tie: bool


def _close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(1.0, abs(a), abs(b))


def choice_verdict(item: ItemRows, mapping: list[int | None], scores: dict[int, RowScores], tolerance: float) -> Verdict:
    """Multiple choice / schema: the option with the lowest mean loss, first on ties."""
    means = []
    for row in mapping:
        # An option with no scored token: torch's mean of nothing, NaN.
        means.append(scores[row].loss.mean().item() if row is not None else math.nan)
    chosen = means.index(min(means))
    near = any(
        mapping[other] != mapping[chosen] and math.isfinite(means[other]) and math.isfinite(means[chosen])
        and _close(means[other], means[chosen], tolerance)
        for other in range(len(means))
        if other != chosen
    )
    return Verdict(chosen == item.gold, near)


def lm_verdict(row: Row, scores: RowScores, tolerance: float) -> Verdict:
    """Language modeling: every continuation token is the greedy prediction."""
    targets = torch.tensor(row.tokens[row.first + 1 : row.last + 1], dtype=torch.long)
    hits = scores.argmax == targets
    correct = bool(hits.all())
    near = False
    if scores.margin is not None:
        fragile = scores.margin <= tolerance * torch.clamp(scores.margin.abs(), min=1.0)
        # Correct: any fragile position could break it. Wrong: only if every miss could flip.
        near = bool(fragile.any()) if correct else bool(fragile[~hits].all())
    return Verdict(correct, near)


def verdicts(
    task_items: list[ItemRows], rows: list[Row], mapping: list[list[int | None]], scores: dict[int, RowScores], tolerance: float
) -> list[Verdict]:
    """One verdict per item of a task."""
    out = []
    for item, options in zip(task_items, mapping, strict=True):
        if item.kind == "language_modeling":
            row = options[0]
            assert row is not None  # sequences refuses a language-modeling item with nothing to score
            out.append(lm_verdict(rows[row], scores[row], tolerance))
        else:
            out.append(choice_verdict(item, options, scores, tolerance))
    return out
