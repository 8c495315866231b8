"""The prompts of one item, character for character as nanochat renders them.

nanochat renders through Jinja templates; the text they produce is, for ``d`` the task's
continuation delimiter and each few-shot example followed by a blank line:

- multiple choice, one prompt per choice:
  ``shot.query + d + shot.choices[shot.gold] + "\\n\\n"`` ... ``item.query + d + choice``;
- schema, one prompt per context option:
  ``shot.context_options[shot.gold] + d + shot.continuation + "\\n\\n"`` ...
  ``option + d + item.continuation``;
- language modeling, two prompts, without and with the continuation:
  ``shot.context.strip() + d + shot.continuation + "\\n\\n"`` ... ``item.context.strip() + d``,
  the first stripped of surrounding whitespace, the second followed by
  ``item.continuation``.

A value is written as ``str(value)`` (what a template does with a number). Which items are
the shots is ``fewshot_indices``: nanochat's draw, per item, from the task's other items.
"""

from __future__ import annotations

import random
from typing import Any

from trnfrontier.errors import TrnfError

# The seeds nanochat uses: one shuffle of the task's items, one few-shot draw per item.
SHUFFLE_SEED = 1337
FEWSHOT_SEED = 1234
SHOT_SEPARATOR = "\n\n"


def shuffled_order(count: int, max_per_task: int | None) -> list[int]:
    """The file positions of a task's ``count`` items in the order they are scored (and
    shots are drawn) in, subsampled when asked. ``random.shuffle``'s permutation depends
    only on the length, so this is the order nanochat's shuffle of the items gives."""
    order = list(range(count))
    random.Random(SHUFFLE_SEED).shuffle(order)
    return order[:max_per_task] if max_per_task and max_per_task > 0 else order


def shuffled(items: list[dict[str, Any]], max_per_task: int | None) -> list[dict[str, Any]]:
    """The items in scoring order (``shuffled_order``)."""
    return [items[k] for k in shuffled_order(len(items), max_per_task)]


def fewshot_indices(index: int, count: int, num_fewshot: int) -> list[int]:
    """The shots of item ``index`` among ``count`` items (itself excluded)."""
    if num_fewshot <= 0:
        return []
    if num_fewshot > count - 1:
        raise TrnfError(
            f"{num_fewshot}-shot needs at least {num_fewshot + 1} items, the task has {count}; "
            "raise --max-per-task (nanochat cannot draw the shots either)"
        )
    others = [i for i in range(count) if i != index]
    return random.Random(FEWSHOT_SEED + index).sample(others, num_fewshot)


def _multiple_choice(item: dict[str, Any], shots: list[dict[str, Any]], d: str) -> list[str]:
    head = "".join(f"{s['query']}{d}{s['choices'][s['gold']]}{SHOT_SEPARATOR}" for s in shots)
    return [f"{head}{item['query']}{d}{choice}" for choice in item["choices"]]


def _schema(item: dict[str, Any], shots: list[dict[str, Any]], d: str) -> list[str]:
    head = "".join(f"{s['context_options'][s['gold']]}{d}{s['continuation']}{SHOT_SEPARATOR}" for s in shots)
    return [f"{head}{option}{d}{item['continuation']}" for option in item["context_options"]]


def _language_modeling(item: dict[str, Any], shots: list[dict[str, Any]], d: str) -> list[str]:
    head = "".join(f"{str(s['context']).strip()}{d}{s['continuation']}{SHOT_SEPARATOR}" for s in shots)
    without = f"{head}{str(item['context']).strip()}{d}"
    return [without.strip(), f"{without}{item['continuation']}"]


RENDERERS = {"multiple_choice": _multiple_choice, "schema": _schema, "language_modeling": _language_modeling}


def prompts(kind: str, items: list[dict[str, Any]], index: int, num_fewshot: int, delimiter: str) -> list[str]:
    """The prompts of ``items[index]`` (in scoring order) with its few-shot examples."""
    shots = [items[i] for i in fewshot_indices(index, len(items), num_fewshot)]
    return RENDERERS[kind](items[index], shots, delimiter)
