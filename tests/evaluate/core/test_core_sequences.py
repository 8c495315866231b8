"""Token rows and scored spans: common prefix / suffix, the language-modeling prefix, the crop."""

from __future__ import annotations

import pytest

from trnfrontier.errors import TrnfError
from trnfrontier.evaluate.core.sequences import common_prefix, common_suffix, item_rows

BOS = 9


def test_common_prefix_and_suffix() -> None:
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix([[1, 2], [1, 2, 3]]) == 2
    assert common_suffix([[5, 1, 7], [6, 1, 7]]) == 2


def test_multiple_choice_spans_start_where_the_rows_differ() -> None:
    rows = item_rows("multiple_choice", {"gold": 1}, [[BOS, 1, 2, 3], [BOS, 1, 4, 5, 6]], None, "x")
    assert rows.starts == (2, 2) and rows.ends == (4, 5) and rows.gold == 1


def test_schema_spans_are_the_common_suffix() -> None:
    rows = item_rows("schema", {"gold": 0}, [[BOS, 1, 7, 8], [BOS, 2, 3, 7, 8]], None, "x")
    assert rows.starts == (2, 3) and rows.ends == (4, 5)


def test_language_modeling_span_is_the_continuation() -> None:
    rows = item_rows("language_modeling", {}, [[BOS, 1, 2], [BOS, 1, 2, 3, 4]], None, "x")
    assert rows.rows == ((BOS, 1, 2, 3, 4),) and rows.starts == (3,) and rows.ends == (5,)


def test_a_prompt_without_that_is_no_token_prefix_is_refused() -> None:
    with pytest.raises(TrnfError, match="item 3.*does not tokenize to a prefix"):
        item_rows("language_modeling", {}, [[BOS, 1, 2], [BOS, 1, 5, 3]], None, "task 't', item 3")
    with pytest.raises(TrnfError, match="does not tokenize to a prefix"):
        item_rows("language_modeling", {}, [[BOS, 1], [BOS, 1]], None, "x")


def test_the_crop_keeps_the_last_tokens_and_shifts_the_span() -> None:
    rows = item_rows("multiple_choice", {"gold": 0}, [[BOS, 1, 2, 3, 4, 5], [BOS, 1, 2, 3, 6]], 4, "x")
    assert rows.rows == ((2, 3, 4, 5), (1, 2, 3, 6))  # the BOS goes with the cut
    assert rows.starts == (2, 3) and rows.ends == (4, 4)


def test_a_span_that_starts_before_the_kept_tokens_is_refused() -> None:
    with pytest.raises(TrnfError, match="longer --seq-len"):
        item_rows("multiple_choice", {"gold": 0}, [[BOS, 1, 2, 3, 4], [BOS, 5, 6, 7, 8]], 3, "x")


def test_a_language_modeling_continuation_that_fills_the_crop_is_refused() -> None:
    with pytest.raises(TrnfError, match="nothing to predict it from"):
        item_rows("language_modeling", {}, [[BOS, 1], [BOS, 1, 2, 3, 4]], 3, "x")


def test_a_choice_span_at_the_first_kept_token_is_kept_for_a_nan_loss() -> None:
    rows = item_rows("multiple_choice", {"gold": 0}, [[BOS, 1, 2, 3, 4], [BOS, 5]], 4, "x")
    assert rows.rows == ((1, 2, 3, 4), (BOS, 5)) and rows.starts == (0, 1)
