"""CORE's verdicts against a deliberately naive reference, item by item.

The reference below is written from the metric's definition (issue 27), not from the
engine's code: one item at a time, one prompt at a time, one row per forward, the full
logits of the model, a Python loop for the choice. The engine must give every item the
same verdict; on a model whose rows are bit-identical whatever the batch (an elementwise
one) exactly, on a real GPT except near-ties, which it must count.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
from core_helpers import random_gpt

from trnfrontier.evaluate.core import render
from trnfrontier.evaluate.core.engine import score_rows, task_rows
from trnfrontier.evaluate.core.protocol import (
    LogitsScorer,
    PositionLogitsScorer,
    RaggedScorer,
    SharedPrefixScorer,
)

ITEMS_PER_TASK = 6


def naive_prompts(kind: str, item: dict[str, Any], shots: list[dict[str, Any]], d: str) -> list[str]:
    context = ""
    if kind == "multiple_choice":
        for shot in shots:
            context += shot["query"] + d + shot["choices"][shot["gold"]] + "\n\n"
        return [context + item["query"] + d + choice for choice in item["choices"]]
    if kind == "schema":
        for shot in shots:
            context += shot["context_options"][shot["gold"]] + d + shot["continuation"] + "\n\n"
        return [context + option + d + item["continuation"] for option in item["context_options"]]
    for shot in shots:
        context += shot["context"].strip() + d + shot["continuation"] + "\n\n"
    context += item["context"].strip() + d
    return [context.strip(), context + item["continuation"]]


def naive_rows(kind: str, prompts: list[str], tokenizer: Any, crop: int | None) -> list[tuple[list[int], int, int]]:
    bos = tokenizer.get_bos_token_id()
    rows = [[bos] + tokenizer.encode(p) for p in prompts]
    if kind == "language_modeling":
        spans = [(rows[1], len(rows[0]), len(rows[1]))]
    elif kind == "multiple_choice":
        start = 0
        while all(start < len(r) for r in rows) and len({r[start] for r in rows}) == 1:
            start += 1
        spans = [(r, start, len(r)) for r in rows]
    else:
        same = 0
        while all(same < len(r) for r in rows) and len({r[-1 - same] for r in rows}) == 1:
            same += 1
        spans = [(r, len(r) - same, len(r)) for r in rows]
    if crop is None:
        return spans
    return [(r[-crop:], s - max(0, len(r) - crop), e - max(0, len(r) - crop)) for r, s, e in spans]


def naive_verdict(model: Any, kind: str, item: dict[str, Any], rows: list[tuple[list[int], int, int]]) -> bool:
    with torch.no_grad():
        if kind == "language_modeling":
            row, start, end = rows[0]
            logits = model(torch.tensor([row]))[0]
            return all(int(logits[t].argmax()) == row[t + 1] for t in range(start - 1, end - 1))
        means = []
        for row, start, end in rows:
            logits = model(torch.tensor([row]))[0]
            losses = [-torch.log_softmax(logits[t], dim=-1)[row[t + 1]] for t in range(start - 1, end - 1)] if start else []
            means.append(torch.stack(losses).mean().item() if losses else math.nan)
        best = 0
        for i in range(1, len(means)):
            if means[i] < means[best]:
                best = i
        return best == item["gold"]


def naive_task(model: Any, tokenizer: Any, task: Any, items: list[dict[str, Any]], crop: int | None) -> list[bool]:
    verdicts = []
    for index, item in enumerate(items):
        shots = []
        if task.num_fewshot:
            others = [i for i in range(len(items)) if i != index]
            shots = [items[i] for i in random.Random(1234 + index).sample(others, task.num_fewshot)]
        rows = naive_rows(task.kind, naive_prompts(task.kind, item, shots, task.delimiter), tokenizer, crop)
        verdicts.append(naive_verdict(model, task.kind, item, rows))
    return verdicts


def reference_verdicts(model: Any, tokenizer: Any, bundle: Any, crop: int | None) -> list[list[bool]]:
    return [naive_task(model, tokenizer, task, render.shuffled(bundle.items(task), ITEMS_PER_TASK), crop) for task in bundle.tasks]


def compare(reference: list[list[bool]], scorer: Any, tokenizer: Any, bundle: Any, crop: int | None, share: bool) -> tuple[int, int, int]:
    """(items, disagreements, disagreements that are not counted near-ties)."""
    total = wrong = unexplained = 0
    for task, expected_verdicts in zip(bundle.tasks, reference, strict=True):
        items = render.shuffled(bundle.items(task), ITEMS_PER_TASK)
        rows = task_rows(task, items, list(range(len(items))), tokenizer, crop)
        verdicts = score_rows(scorer, rows, batch_tokens=512, tolerance=1e-4, share_prefixes=share)
        for expected, got in zip(expected_verdicts, verdicts, strict=True):
            total += 1
            if expected != got.correct:
                wrong += 1
                unexplained += not got.near_tie
    return total, wrong, unexplained


def test_an_elementwise_model_gets_exactly_the_reference_verdicts(sample_bundle, tokenizer, tiny_models) -> None:
    # Rows are bit-identical whatever the batch: no tolerance may be needed.
    model = tiny_models.RandomLogits(8192, seed=3).eval()
    reference = reference_verdicts(model, tokenizer, sample_bundle.bundle, None)
    total, wrong, _ = compare(reference, LogitsScorer(model, torch.device("cpu")), tokenizer, sample_bundle.bundle, None, False)
    assert total == ITEMS_PER_TASK * len(sample_bundle.bundle.tasks)
    assert wrong == 0


@pytest.mark.parametrize("crop", [None, 40])
def test_a_gpt_gets_the_reference_verdicts_except_counted_near_ties(sample_bundle, tokenizer, gpt, crop) -> None:
    reference = reference_verdicts(gpt, tokenizer, sample_bundle.bundle, crop)
    for adapter in (LogitsScorer, PositionLogitsScorer, SharedPrefixScorer, RaggedScorer):
        share = adapter in (SharedPrefixScorer, RaggedScorer)
        total, wrong, unexplained = compare(reference, adapter(gpt, torch.device("cpu")), tokenizer, sample_bundle.bundle, crop, share)
        assert unexplained == 0, f"{adapter.__name__}: {unexplained} of {total} verdicts differ from the reference without a near-tie"
        assert wrong <= 2  # a verdict flipping on ~1e-6 needs options ~1e-6 apart: rare


def test_exact_ties_go_to_the_first_option_as_python_min_does(sample_bundle, tokenizer, tiny_models) -> None:
    # Equal logits everywhere: every option of an item has exactly the same mean loss.
    model = tiny_models.ZeroLogits(8192).eval()
    for task in sample_bundle.bundle.tasks:
        if task.kind == "language_modeling":
            continue
        items = render.shuffled(sample_bundle.bundle.items(task), ITEMS_PER_TASK)
        rows = task_rows(task, items, list(range(len(items))), tokenizer, None)
        verdicts = score_rows(LogitsScorer(model, torch.device("cpu")), rows, batch_tokens=512, tolerance=1e-4)
        assert [v.correct for v in verdicts] == [item["gold"] == 0 for item in items]
        assert [v.correct for v in verdicts] == naive_task(model, tokenizer, task, items, None)


def test_a_choice_with_no_scored_token_has_a_nan_loss_as_in_the_reference(tokenizer, tiny_models) -> None:
    from trnfrontier.evaluate.core.bundle import Task

    # " yes" tokenizes to a prefix of " yes yes": the common prefix is the whole first
    # choice, which is left with nothing to score (NaN); Python's min then keeps the
    # first element when it is NaN and skips NaNs after it.
    task = Task("t", "multiple_choice", "t.jsonl", 0, " ", 50.0)
    items = [
        {"query": "Say it:", "choices": ["yes", "yes yes"], "gold": 0},
        {"query": "Say it:", "choices": ["no no", "no"], "gold": 0},
        {"query": "Say it:", "choices": ["no no", "no"], "gold": 1},
    ]
    model = tiny_models.RandomLogits(8192, seed=1).eval()
    rows = task_rows(task, items, [0, 1, 2], tokenizer, None)
    assert rows[0].starts[0] == rows[0].ends[0]
    verdicts = score_rows(LogitsScorer(model, torch.device("cpu")), rows, batch_tokens=512, tolerance=1e-4)
    assert [v.correct for v in verdicts] == naive_task(model, tokenizer, task, items, None) == [True, True, False]


def test_a_second_seed_and_depth_agree_too(sample_bundle, tokenizer) -> None:
    model = random_gpt(seed=7, width=64, depth=1)
    reference = reference_verdicts(model, tokenizer, sample_bundle.bundle, None)
    for adapter in (SharedPrefixScorer, RaggedScorer):
        total, _wrong, unexplained = compare(reference, adapter(model, torch.device("cpu")), tokenizer, sample_bundle.bundle, None, True)
        assert total and unexplained == 0
