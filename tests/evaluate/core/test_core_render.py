"""Prompts, shuffling and few-shot draws, character for character."""

from __future__ import annotations

import random

import pytest

from trnfrontier.errors import TrnfError
from trnfrontier.evaluate.core import render

MC = [{"query": f"Q{i}?", "choices": [f"a{i}", f"b{i}"], "gold": i % 2} for i in range(5)]
SCHEMA = [{"context_options": [f"x{i} said", f"y{i} said"], "continuation": f"it {i}.", "gold": 1 - i % 2} for i in range(5)]
LM = [{"context": f"  passage {i} \n", "continuation": f"end{i}"} for i in range(5)]


def test_multiple_choice_prompts_share_the_context_and_differ_in_the_choice() -> None:
    assert render.prompts("multiple_choice", MC, 0, 0, " ") == ["Q0? a0", "Q0? b0"]
    shots = render.fewshot_indices(2, 5, 2)
    head = "".join(f"Q{i}? {MC[i]['choices'][i % 2]}\n\n" for i in shots)
    assert render.prompts("multiple_choice", MC, 2, 2, " ") == [head + "Q2? a2", head + "Q2? b2"]


def test_schema_prompts_differ_in_the_context_and_share_the_continuation() -> None:
    shots = render.fewshot_indices(0, 5, 1)
    head = "".join(f"{SCHEMA[i]['context_options'][1 - i % 2]}::it {i}.\n\n" for i in shots)
    assert render.prompts("schema", SCHEMA, 0, 1, "::") == [head + "x0 said::it 0.", head + "y0 said::it 0."]


def test_language_modeling_strips_contexts_and_the_prompt_without_the_continuation() -> None:
    without, with_continuation = render.prompts("language_modeling", LM, 1, 0, "\nAnswer: ")
    assert without == "passage 1\nAnswer:"  # the trailing delimiter space stripped
    assert with_continuation == "passage 1\nAnswer: end1"
    without, _ = render.prompts("language_modeling", LM, 1, 1, " ")
    shot = render.fewshot_indices(1, 5, 1)[0]
    assert without == f"passage {shot} end{shot}\n\npassage 1"


def test_values_are_written_as_str_writes_them() -> None:
    items = [{"query": 12, "choices": [1.5, True], "gold": 0}]
    assert render.prompts("multiple_choice", items, 0, 0, " ") == ["12 1.5", "12 True"]


def test_items_are_shuffled_with_seed_1337_before_subsampling() -> None:
    items = [{"n": i} for i in range(10)]
    expected = list(items)
    random.Random(1337).shuffle(expected)
    assert render.shuffled(items, None) == expected
    assert render.shuffled(items, 3) == expected[:3]
    assert items == [{"n": i} for i in range(10)]  # the caller's list is left alone


def test_shots_are_drawn_per_item_with_seed_1234_plus_its_index() -> None:
    assert render.fewshot_indices(4, 10, 3) == random.Random(1238).sample([0, 1, 2, 3, 5, 6, 7, 8, 9], 3)
    assert render.fewshot_indices(4, 10, 0) == []


def test_too_few_items_for_the_shots_is_one_clear_error() -> None:
    with pytest.raises(TrnfError, match="3-shot needs at least 4 items, the task has 3"):
        render.fewshot_indices(0, 3, 3)
