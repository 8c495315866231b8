"""The ragged scoring forward: each token computed once, logits equal to the whole forward's."""

from __future__ import annotations

import pytest
import torch
from test_model import VOCAB, make_model

from trnfrontier.runtime.ragged_forward import layout

torch.set_num_threads(1)


def whole_rows(prefix: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor, owner: torch.Tensor) -> list[torch.Tensor]:
    return [torch.cat((prefix[g, : lengths[g]], rows[r])) for r, g in enumerate(owner.tolist())]


def expected_logits(model, prefix, lengths, rows, owner, at_rows, at_cols) -> torch.Tensor:
    """Each scored position from ``model.forward`` of its own whole sequence, alone."""
    sequences = whole_rows(prefix, lengths, rows, owner)
    with torch.no_grad():
        out = [model(sequences[r][None])[0, lengths[owner[r]] + c] for r, c in zip(at_rows.tolist(), at_cols.tolist(), strict=True)]
    return torch.stack(out)


@pytest.mark.parametrize(
    ("depth", "kv_heads", "lengths", "extras"),
    [
        (2, 2, [7, 3, 0], {}),
        (1, 4, [5, 5, 5], {}),
        (3, 1, [0, 0, 0], {}),
        (2, 4, [11, 1, 6], {"value_embeds": False, "softcap": 0.0}),
    ],
)
def test_ragged_logits_equal_the_forward_of_each_whole_sequence(depth: int, kv_heads: int, lengths: list[int], extras: dict) -> None:
    model = make_model(n_layer=depth, n_kv_head=kv_heads, **{"value_embeds": True, **extras})
    torch.manual_seed(4)
    prefix_lengths = torch.tensor(lengths)
    prefix = torch.randint(0, VOCAB, (3, max(lengths)))
    rows = torch.randint(0, VOCAB, (6, 9))
    owner = torch.tensor([0, 0, 1, 2, 2, 2])
    # Rows scored over different spans, one of them only at its first column, and some
    # columns never scored after the last scored one (they must not matter).
    at_rows = torch.tensor([0, 0, 1, 2, 3, 3, 4, 5, 5])
    at_cols = torch.tensor([0, 8, 4, 2, 0, 1, 7, 3, 5])
    with torch.no_grad():
        got = model.logits_ragged(prefix, prefix_lengths, rows, owner, at_rows, at_cols)
    torch.testing.assert_close(got, expected_logits(model, prefix, prefix_lengths, rows, owner, at_rows, at_cols), atol=1e-5, rtol=1e-5)


def test_tokens_after_the_last_scored_column_and_prefix_padding_do_not_change_a_logit() -> None:
    model = make_model(n_kv_head=2, value_embeds=True)
    torch.manual_seed(5)
    prefix, rows = torch.randint(0, VOCAB, (2, 6)), torch.randint(0, VOCAB, (3, 8))
    owner, lengths = torch.tensor([0, 1, 1]), torch.tensor([6, 2])
    at_rows, at_cols = torch.tensor([0, 1, 2]), torch.tensor([3, 2, 4])
    other_prefix, other_rows = prefix.clone(), rows.clone()
    other_prefix[1, 2:] = (other_prefix[1, 2:] + 1) % VOCAB  # the padding of prefix 1
    other_rows[:, 6:] = (other_rows[:, 6:] + 1) % VOCAB  # after every scored column
    with torch.no_grad():
        first = model.logits_ragged(prefix, lengths, rows, owner, at_rows, at_cols)
        second = model.logits_ragged(other_prefix, lengths, other_rows, owner, at_rows, at_cols)
    torch.testing.assert_close(first, second, atol=0, rtol=0)


def test_the_layout_computes_each_needed_token_once() -> None:
    prefix = torch.zeros(2, 5, dtype=torch.long)
    rows = torch.zeros(3, 7, dtype=torch.long)
    at = layout(prefix, torch.tensor([5, 2]), rows, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 2, 2]), torch.tensor([1, 6, 0, 3]))
    # Prefixes 5 + 2 tokens, tails up to their last scored column: 2 + 7 + 4.
    assert at.n_prefix == 7 and at.ids.numel() == 7 + 13
    assert at.positions[at.n_prefix :].tolist() == [5, 6, 5, 6, 7, 8, 9, 10, 11, 2, 3, 4, 5]
    assert at.scored.tolist() == [1, 8, 9, 12]
