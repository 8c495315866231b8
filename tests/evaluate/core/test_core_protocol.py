"""The scoring protocol: which adapter a model gets, and what a scorer must return."""

from __future__ import annotations

import pytest
import torch
from core_helpers import elementwise_model, random_gpt

from trnfrontier.evaluate.core.engine import score_rows
from trnfrontier.evaluate.core.protocol import (
    LogitsScorer,
    NativeScorer,
    RaggedScorer,
    full_rows,
    normalise,
    scorer_for,
)
from trnfrontier.evaluate.core.sequences import ItemRows

CPU = torch.device("cpu")


class Native(torch.nn.Module):
    """A model with its own ``core_score`` (what a Phase 2 inference.py may provide)."""

    shares_prefixes = True

    def __init__(self) -> None:
        super().__init__()
        self.inner = elementwise_model(vocab=16)
        self.calls: list[tuple[int, int]] = []

    def core_score(self, prefix, rows, owner, positions):
        self.calls.append((prefix.size(1), rows.size(0)))
        ids = full_rows(prefix, rows, owner)
        r, t = positions[:, 0], positions[:, 1] + prefix.size(1)
        logits = self.inner(ids)[r, t]
        return torch.nn.functional.cross_entropy(logits, ids[r, t + 1], reduction="none"), logits.argmax(-1)


def test_each_kind_of_model_gets_its_adapter() -> None:
    assert isinstance(scorer_for(elementwise_model(vocab=16), CPU), LogitsScorer)
    assert isinstance(scorer_for(random_gpt(), CPU), RaggedScorer)
    native = scorer_for(Native(), CPU)
    assert isinstance(native, NativeScorer) and native.shares_prefixes


def test_a_native_scorer_is_sent_shared_prefixes_and_its_verdicts_match_the_logits_adapter() -> None:
    model = Native()
    item = ItemRows("multiple_choice", ((9, 1, 2, 3, 4), (9, 1, 2, 3, 5, 6)), (4, 4), (5, 6), 1)
    native = score_rows(scorer_for(model, CPU), [item], batch_tokens=64, tolerance=1e-4, share_prefixes=True)
    plain = score_rows(LogitsScorer(model.inner, CPU), [item], batch_tokens=64, tolerance=1e-4)
    assert model.calls == [(3, 2)]  # the common prefix up to the first scored position, once
    assert native == plain


def test_a_scorer_returning_the_wrong_shape_is_named() -> None:
    with pytest.raises(TypeError, match=r"returns \(loss, argmax\)"):
        normalise(torch.zeros(3), 3)
    with pytest.raises(TypeError, match=r"argmax must be a tensor of shape \[3\]"):
        normalise((torch.zeros(3), torch.zeros(2)), 3)
    loss, argmax, margin = normalise((torch.zeros(3), torch.zeros(3)), 3)
    assert margin is None and argmax.dtype == torch.long


def test_a_forward_that_returns_no_logits_is_named() -> None:
    class Hidden(torch.nn.Module):
        def forward(self, x):
            return torch.zeros(*x.shape, 4)[..., :2].sum(-1)

    scorer = LogitsScorer(Hidden(), CPU)
    with pytest.raises(TypeError, match=r"must return logits \[B, T, vocab\]"):
        scorer(torch.empty(1, 0, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.tensor([[0, 1]]))


def test_scores_from_logits_give_torchs_argmax_first_on_ties_and_nan() -> None:
    from trnfrontier.evaluate.core.protocol import scores_from_logits

    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    logits[1, [3, 40]] = 9.0  # an exact tie: the first index wins
    logits[2] = 0.0  # every logit tied
    logits[3, 7] = float("nan")
    logits[4, [10, 20, 30]] = 5.0
    loss, argmax, margin = scores_from_logits(logits, torch.zeros(6, dtype=torch.long))
    assert torch.equal(argmax, logits.argmax(dim=-1))
    assert argmax[1] == 3 and argmax[2] == 0 and argmax[4] == 10
    assert margin[1] == 0 and margin[0] > 0
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, torch.zeros(6, dtype=torch.long), reduction="none"), equal_nan=True)
