"""One task's items through a scorer: prompts, token rows, batches, verdicts.

``task_rows`` renders and tokenizes the chosen items of a task (all of them in one
tokenizer call); ``score_rows`` runs the batches through the scorer and returns one
``Verdict`` per item, reporting progress as rows are scored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trnfrontier.evaluate.core import render
from trnfrontier.evaluate.core.batching import distinct_rows, plan
from trnfrontier.evaluate.core.bundle import Task
from trnfrontier.evaluate.core.protocol import Scorer, normalise
from trnfrontier.evaluate.core.scoring import RowScores, Verdict, verdicts
from trnfrontier.evaluate.core.sequences import ItemRows, item_rows


def task_rows(
    task: Task, items: list[dict[str, Any]], indices: list[int], tokenizer: Any, crop: int | None,
    origins: list[str] | None = None,
) -> list[ItemRows]:
    """The rows of ``items[i]`` for each i in ``indices`` (``items`` in scoring order;
    ``origins[i]``, the ``file:line`` of ``items[i]``, names an item that cannot be scored)."""
    prompts = [render.prompts(task.kind, items, i, task.num_fewshot, task.delimiter) for i in indices]
    flat = [text for group in prompts for text in group]
    tokens = tokenizer.encode(flat, prepend=tokenizer.get_bos_token_id()) if flat else []
    out, at = [], 0
    for i, group in zip(indices, prompts, strict=True):
        where = f"{origins[i]} (task {task.label!r})" if origins else f"task {task.label!r}, item {i} (in scoring order)"
        out.append(item_rows(task.kind, items[i], [list(t) for t in tokens[at : at + len(group)]], crop, where))
        at += len(group)
    return out


def score_rows(
    scorer: Scorer,
    task_items: list[ItemRows],
    *,
    batch_tokens: int,
    tolerance: float,
    share_prefixes: bool = False,
    on_rows: Callable[[int, int], None] | None = None,
) -> list[Verdict]:
    """Verdicts of ``task_items``; ``on_rows(done, total)`` after each batch."""
    rows, mapping = distinct_rows(task_items)
    scores: dict[int, RowScores] = {}
    budget = min(batch_tokens, int(getattr(scorer, "batch_tokens", batch_tokens)))
    ragged = share_prefixes and bool(getattr(scorer, "ragged_prefixes", False))
    for batch in plan(rows, budget, share=share_prefixes, ragged=ragged):
        count = batch.positions.size(0)
        extra = {"prefix_lengths": batch.prefix_lengths} if ragged else {}
        loss, argmax, margin = normalise(scorer(batch.prefix, batch.rows, batch.owner, batch.positions, **extra), count)
        at = 0
        for row_id, n in zip(batch.row_ids, batch.counts, strict=True):
            scores[row_id] = RowScores(loss[at : at + n], argmax[at : at + n], None if margin is None else margin[at : at + n])
            at += n
        if on_rows is not None:
            on_rows(len(scores), len(rows))
    return verdicts(task_items, rows, mapping, scores, tolerance)
