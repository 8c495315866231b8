"""An item's prompts as token rows, each with the span of tokens that is scored.

As nanochat builds them: every prompt is tokenized with BOS prepended;

- multiple choice: the choices follow one shared context, so every row's span starts
  where the rows first differ (their common prefix) and ends at the row's end;
- schema: the contexts differ and the continuation is shared, so each span is the
  rows' common suffix;
- language modeling: one row, the prompt with the continuation; the span starts at the
  length of the prompt without it, which must be a token prefix of it.

A row longer than the crop length keeps its last ``crop`` tokens (the BOS goes with the
cut) and its span shifts with it. A span that would start before the kept tokens is
refused (nanochat's assertion); one that starts exactly at the first kept token keeps
nanochat's outcome: a choice with no scored token has a NaN loss, and in a language
modeling item there is no token to predict the first one from, which nanochat cannot
score either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trnfrontier.errors import TrnfError

ItemRowsParts = tuple[list[list[int]], list[int], list[int]]


@dataclass(frozen=True)
class ItemRows:
    """One item ready to score: token rows and, per row, the scored span [start, end)."""

    kind: str
    rows: tuple[tuple[int, ...], ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    gold: int  # the correct row (0 for language modeling)


def common_prefix(rows: list[list[int]]) -> int:
    shortest = min(len(row) for row in rows)
    first = rows[0]
    for i in range(shortest):
        if any(row[i] != first[i] for row in rows):
            return i
    return shortest


def common_suffix(rows: list[list[int]]) -> int:
    return common_prefix([row[::-1] for row in rows])


def spans(kind: str, tokens: list[list[int]], where: str) -> ItemRowsParts:
    """(rows, starts, ends) of an item's tokenized prompts, before cropping."""
    if kind == "multiple_choice":
        start = common_prefix(tokens)
        return tokens, [start] * len(tokens), [len(row) for row in tokens]
    if kind == "schema":
        suffix = common_suffix(tokens)
        return tokens, [len(row) - suffix for row in tokens], [len(row) for row in tokens]
    without, with_continuation = tokens
    start, end = len(without), len(with_continuation)
    if start >= end or with_continuation[:start] != without:
        raise TrnfError(
            f"{where}: the prompt without its continuation does not tokenize to a prefix of the prompt with it; "
            "the item cannot be scored (nanochat asserts the same)"
        )
    return [with_continuation], [start], [end]


def crop(rows: list[list[int]], starts: list[int], ends: list[int], length: int | None, where: str) -> ItemRowsParts:
    """Keep each row's last ``length`` tokens, shifting its span (no-op for None)."""
    if length is None:
        return rows, starts, ends
    out_rows, out_starts, out_ends = [], [], []
    for row, start, end in zip(rows, starts, ends, strict=True):
        cut = max(0, len(row) - length)
        if start - cut < 0:
            raise TrnfError(
                f"{where}: its scored tokens start {cut - start} token(s) before the last {length} it keeps "
                "(the crop length); score with a longer --seq-len (nanochat cannot score it either)"
            )
        out_rows.append(row[cut:])
        out_starts.append(start - cut)
        out_ends.append(end - cut)
    return out_rows, out_starts, out_ends


def item_rows(kind: str, item: dict[str, Any], tokens: list[list[int]], crop_length: int | None, where: str) -> ItemRows:
    """The rows of one item from its tokenized prompts (BOS already prepended)."""
    rows, starts, ends = crop(*spans(kind, tokens, where), crop_length, where)
    if kind == "language_modeling" and starts[0] == 0:
        raise TrnfError(
            f"{where}: after cropping to {crop_length} tokens its continuation starts at the first kept token, "
            "with nothing to predict it from; score with a longer --seq-len (nanochat cannot score it either)"
        )
    return ItemRows(kind, tuple(tuple(row) for row in rows), tuple(starts), tuple(ends), int(item.get("gold", 0)))
