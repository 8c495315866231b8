"""Many items per forward: token rows grouped by length into batches of a token budget.

nanochat runs one forward per item, padded to that item's longest row. Here every row of
a task that has a scored token becomes one ``Row``; identical rows of one item (two
choices that tokenize alike) are scored once, so they keep nanochat's exact tie; rows
sorted by length fill batches of at most ``batch_tokens`` padded tokens, so padding is
small and each forward is large.

With a scorer that shares prefixes, the rows of one item are sent with their common
prefix once (``Batch.prefix``) and only their differing tails as rows: cut to the batch's
shortest prefix, or, for a ragged scorer (``ragged_prefixes``), each item's whole prefix
(``Batch.prefix_lengths``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from trnfrontier.evaluate.core.sequences import ItemRows, common_prefix

# A batch closes before padding would be more than this share of what it computes; with
# shared prefixes, also counting the prefix tokens a row computes because the batch's
# prefix is shorter than its own (a larger share: a separate batch costs more there).
MAX_PADDING = 0.1
MAX_PADDING_SHARED = 0.3
# A ragged scorer pads only inside attention, a small share of a forward's work.
MAX_PADDING_RAGGED = 0.5


@dataclass(frozen=True)
class Row:
    """One distinct token row to score: positions ``first .. last - 1`` predict the next token."""

    item: int  # the item's index in its task
    tokens: tuple[int, ...]
    first: int  # the first scored position (span start - 1)
    last: int  # one past the last scored position (span end - 1)


@dataclass(frozen=True)
class Batch:
    """One scorer call: the protocol's tensors and, per position, the row it belongs to."""

    prefix: Tensor
    prefix_lengths: Tensor  # [G]: prefix row g is its first prefix_lengths[g] tokens (the rest is padding)
    rows: Tensor
    owner: Tensor
    positions: Tensor
    row_ids: list[int]  # per batch row r, the index of its Row
    counts: list[int]  # per batch row r, how many positions it has (in order)


def distinct_rows(task_items: list[ItemRows]) -> tuple[list[Row], list[list[int | None]]]:
    """The rows to score and, per item and option, the index of its Row (None: no scored
    token, a NaN loss as in nanochat)."""
    rows: list[Row] = []
    index: list[list[int | None]] = []
    for number, item in enumerate(task_items):
        seen: dict[tuple[tuple[int, ...], int, int], int] = {}
        mapping: list[int | None] = []
        for tokens, start, end in zip(item.rows, item.starts, item.ends, strict=True):
            if start < 1 or end <= start:
                mapping.append(None)
                continue
            key = (tokens, start, end)
            if key not in seen:
                seen[key] = len(rows)
                rows.append(Row(number, tokens, start - 1, end - 1))
            mapping.append(seen[key])
        index.append(mapping)
    return rows, index


def _groups(rows: list[Row], share: bool) -> list[list[int]]:
    """Row indices that travel together: an item's rows when prefixes are shared, else one each."""
    if not share:
        return [[i] for i in range(len(rows))]
    by_item: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_item.setdefault(row.item, []).append(i)
    return list(by_item.values())


def _shared_length(rows: list[Row], members: list[int]) -> int:
    """How many leading tokens the members can take from one prefix: their common prefix,
    ending before the first scored position (a single row shares nothing)."""
    if len(members) < 2:
        return 0
    tokens = [list(rows[i].tokens) for i in members]
    return min(common_prefix(tokens), min(rows[i].first for i in members))


def plan(rows: list[Row], batch_tokens: int, share: bool = False, ragged: bool = False) -> Iterator[Batch]:
    """Batches of at most ``batch_tokens`` padded tokens (a single larger row goes alone).

    ``ragged`` (a scorer that takes each prefix at its own length and pads only inside
    attention): every item keeps its whole shared prefix, and a batch closes on its real
    tokens and on padding only past the larger ``MAX_PADDING_RAGGED``."""
    share = share or ragged
    groups = _groups(rows, share)
    shared = [_shared_length(rows, members) for members in groups]
    # Longest tails last, so each batch pads its rows to a length close to theirs.
    order = sorted(range(len(groups)), key=lambda g: (shared[g], max(len(rows[i].tokens) for i in groups[g]) - shared[g]))
    slack = MAX_PADDING_RAGGED if ragged else MAX_PADDING_SHARED if share else MAX_PADDING
    chosen: list[int] = []
    for g in order:
        trial = chosen + [g]
        if chosen:
            padded, real = _tokens(rows, groups, shared, trial, ragged)
            if padded > batch_tokens or padded - real > slack * padded:
                yield _batch(rows, groups, shared, chosen, ragged)
                trial = [g]
        chosen = trial
    if chosen:
        yield _batch(rows, groups, shared, chosen, ragged)


def _prefix_lengths(shared: list[int], chosen: list[int], ragged: bool) -> list[int]:
    """Each chosen group's prefix length: its own when ragged, else the batch's shortest."""
    if ragged:
        return [shared[g] for g in chosen]
    return [min(shared[g] for g in chosen)] * len(chosen)


def _tokens(rows: list[Row], groups: list[list[int]], shared: list[int], chosen: list[int], ragged: bool) -> tuple[int, int]:
    """(tokens the batch's tensors hold, tokens each group alone would compute: its own
    prefix once and its rows' tails, without padding)."""
    lengths = _prefix_lengths(shared, chosen, ragged)
    tails = [len(rows[i].tokens) - length for g, length in zip(chosen, lengths, strict=True) for i in groups[g]]
    alone = sum(shared[g] + sum(len(rows[i].tokens) - shared[g] for i in groups[g]) for g in chosen)
    return len(chosen) * max(lengths) + len(tails) * max(tails), alone


def _batch(rows: list[Row], groups: list[list[int]], shared: list[int], chosen: list[int], ragged: bool) -> Batch:
    lengths = _prefix_lengths(shared, chosen, ragged)
    members = [(slot, i) for slot, g in enumerate(chosen) for i in groups[g]]
    width = max(len(rows[i].tokens) - lengths[slot] for slot, i in members)
    pad = rows[members[0][1]].tokens[0]  # BOS: every row starts with it
    prefix = torch.full((len(chosen), max(lengths)), pad, dtype=torch.long)
    table = torch.full((len(members), width), pad, dtype=torch.long)
    positions: list[tuple[int, int]] = []
    counts: list[int] = []
    for r, (slot, i) in enumerate(members):
        tokens, length = rows[i].tokens, lengths[slot]
        if length:
            prefix[slot, :length] = torch.tensor(tokens[:length])
        table[r, : len(tokens) - length] = torch.tensor(tokens[length:])
        span = range(rows[i].first - length, rows[i].last - length)
        positions.extend((r, j) for j in span)
        counts.append(len(span))
    owner = torch.tensor([slot for slot, _ in members], dtype=torch.long)
    return Batch(
        prefix=prefix,
        prefix_lengths=torch.tensor(lengths, dtype=torch.long),
        rows=table,
        owner=owner,
        positions=torch.tensor(positions, dtype=torch.long).reshape(-1, 2),
        row_ids=[i for _, i in members],
        counts=counts,
    )
