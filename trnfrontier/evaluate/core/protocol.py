"""The one call CORE scores a model through, and the adapters that provide it.

CORE needs, at chosen positions of chosen token rows, the loss of the token that follows
and the model's greedy prediction there; never the full [rows, length, vocab] logits. A
scorer is any callable

    scorer(prefix, rows, owner, positions) -> (loss, argmax) or (loss, argmax, margin)

with, all tensors on the CPU or the scorer's device:

- ``prefix``: int64 [G, P], token rows shared by several rows (P may be 0);
- ``rows``: int64 [R, S], the rest of each row, right-padded with BOS; row r's full
  sequence is ``prefix[owner[r]] + rows[r]`` (P + S tokens, causal: padding is never read
  by a scored position);
- ``owner``: int64 [R], which prefix row r continues;
- ``positions``: int64 [N, 2], pairs (r, j) with 0 <= j < S - 1: score the token
  ``rows[r, j + 1]`` from everything up to and including ``rows[r, j]`` (full position
  P + j). Every scored position lies after the prefix;

returning, for each of the N positions, ``loss`` (float, -log softmax of the logits at
that position, taken at the next token, in the dtype the logits have: nanochat's
``cross_entropy``), ``argmax`` (int64, the index of the largest logit, first on ties:
``torch.argmax``), and optionally ``margin`` (float, largest logit minus the second
largest; used only to count language-modeling items a ~1e-6 change of the logits could
flip). The logits must be the model's forward at those positions (pure, causal,
independent of the other rows), as nanochat's ``model(input_ids)`` gives them.

A scorer that computes the prefix once for all the rows that share it (a KV cache) sets
the attribute ``shares_prefixes = True``; otherwise the engine sends P = 0 and whole rows.
One that also sets ``ragged_prefixes = True`` is called with the keyword
``prefix_lengths``, int64 [G]: prefix row g is then only its first ``prefix_lengths[g]``
tokens (the rest is padding) and row r's sequence is ``prefix[g, :prefix_lengths[g]] +
rows[r]`` with g = ``owner[r]``, so each item keeps its whole shared context in a batch of
items whose contexts differ in length.
A scorer may also set ``batch_tokens``, the most padded tokens it wants per call.

``scorer_for(model)`` picks, for a ``torch.nn.Module``: its own ``core_score`` method when
it has one (the same signature); else, when it has ``hidden_ragged`` and ``head`` (trnf's GPT: each
needed token computed once, ``runtime/ragged_forward.py``) or ``logits_after_prefix``, a
scorer that shares prefixes through it; else, when it has ``logits_at(idx, rows, cols)``
(the lm head only at those positions), a scorer over it; else one over
``model(idx) -> logits [B, T, vocab]`` (any ``load_for_eval`` model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

Scores = tuple[Tensor, Tensor, "Tensor | None"]
Scorer = Callable[..., Any]


def full_rows(prefix: Tensor, rows: Tensor, owner: Tensor) -> Tensor:
    """Each row's whole sequence, ``prefix[owner[r]] + rows[r]`` ([R, P + S])."""
    if prefix.size(1) == 0:
        return rows
    return torch.cat((prefix.index_select(0, owner), rows), dim=1)


def scores_from_logits(logits: Tensor, targets: Tensor) -> Scores:
    """Loss of ``targets``, argmax and top-2 margin of logits [N, vocab], in their dtype."""
    loss = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    if logits.size(-1) == 1:
        return loss, logits.argmax(dim=-1), torch.full((logits.size(0),), float("inf"))
    top = logits.topk(2, dim=-1)
    margin = (top.values[:, 0] - top.values[:, 1]).float()
    # The top-1 index is the argmax where the largest logit is unique; elsewhere (a tie,
    # or NaN) torch.argmax decides, first on ties, as nanochat's own argmax does.
    argmax = top.indices[:, 0].clone()
    unsure = ~(top.values[:, 0] > top.values[:, 1])
    if bool(unsure.any()):
        argmax[unsure] = logits[unsure].argmax(dim=-1)
    return loss, argmax, margin


def normalise(result: Any, count: int) -> Scores:
    """A scorer's return value as (loss, argmax, margin or None), checked for shape."""
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise TypeError(f"a CORE scorer returns (loss, argmax) or (loss, argmax, margin), not {type(result).__name__}")
    loss, argmax = result[0], result[1]
    margin = result[2] if len(result) == 3 else None
    for name, value in (("loss", loss), ("argmax", argmax), ("margin", margin)):
        if value is not None and (not isinstance(value, Tensor) or value.shape != (count,)):
            raise TypeError(f"a CORE scorer's {name} must be a tensor of shape [{count}] (one per position)")
    return loss.detach().cpu(), argmax.detach().cpu().long(), None if margin is None else margin.detach().cpu().float()


class _ModuleScorer:
    """Scores through a module on ``device``; whole rows (the prefix is not shared)."""

    shares_prefixes = False

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device

    def _inputs(self, prefix: Tensor, rows: Tensor, owner: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        ids = full_rows(prefix, rows, owner).to(self.device)
        r = positions[:, 0].to(self.device)
        t = (positions[:, 1] + prefix.size(1)).to(self.device)
        return ids, r, t, ids[r, t + 1]


class LogitsScorer(_ModuleScorer):
    """Any module whose forward maps token ids [B, T] to logits [B, T, vocab]."""

    # The whole [tokens, vocab] logits exist here: at 1,024 tokens (32 MB of float32 at a
    # vocabulary of 8,192) a CPU scored the format sample 1.5x faster than at 8,192.
    batch_tokens = 1024

    @torch.no_grad()
    def __call__(self, prefix: Tensor, rows: Tensor, owner: Tensor, positions: Tensor) -> Scores:
        ids, r, t, targets = self._inputs(prefix, rows, owner, positions)
        logits = self.model(ids)
        if not isinstance(logits, Tensor) or logits.dim() != 3 or logits.shape[:2] != ids.shape:
            raise TypeError(f"the model's forward must return logits [B, T, vocab]; got {_describe(logits)} for input {tuple(ids.shape)}")
        return scores_from_logits(logits[r, t], targets)


class PositionLogitsScorer(_ModuleScorer):
    """A module with ``logits_at(idx, rows, cols)``: logits [N, vocab] at those positions only."""

    @torch.no_grad()
    def __call__(self, prefix: Tensor, rows: Tensor, owner: Tensor, positions: Tensor) -> Scores:
        ids, r, t, targets = self._inputs(prefix, rows, owner, positions)
        return scores_from_logits(self.model.logits_at(ids, r, t), targets)


class SharedPrefixScorer:
    """A module with ``logits_after_prefix(prefix, rows, owner, at_rows, at_cols)`` (trnf's
    GPT): each prefix row computed once for every row that continues it."""

    shares_prefixes = True

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device

    @torch.no_grad()
    def __call__(self, prefix: Tensor, rows: Tensor, owner: Tensor, positions: Tensor) -> Scores:
        prefix, rows, owner = prefix.to(self.device), rows.to(self.device), owner.to(self.device)
        r, j = positions[:, 0].to(self.device), positions[:, 1].to(self.device)
        logits = self.model.logits_after_prefix(prefix, rows, owner, r, j)
        return scores_from_logits(logits, rows[r, j + 1])


class RaggedScorer:
    """A module with ``hidden_ragged(prefix, prefix_lengths, rows, owner, at_rows, at_cols)``
    and ``head(hidden)`` (trnf's GPT): each prefix at its own length, no padding outside
    attention, and the head over ``HEAD_POSITIONS`` positions at a time (its [positions,
    vocab] logits stay small enough for the allocator to reuse)."""

    shares_prefixes = True
    ragged_prefixes = True
    HEAD_POSITIONS = 512

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device

    @torch.no_grad()
    def __call__(self, prefix: Tensor, rows: Tensor, owner: Tensor, positions: Tensor, prefix_lengths: Tensor | None = None) -> Scores:
        if prefix_lengths is None:
            prefix_lengths = torch.full((prefix.size(0),), prefix.size(1), dtype=torch.long)
        prefix, rows, owner = prefix.to(self.device), rows.to(self.device), owner.to(self.device)
        r, j = positions[:, 0].to(self.device), positions[:, 1].to(self.device)
        hidden = self.model.hidden_ragged(prefix, prefix_lengths.to(self.device), rows, owner, r, j)
        targets = rows[r, j + 1]
        parts = [
            scores_from_logits(self.model.head(h), t)
            for h, t in zip(hidden.split(self.HEAD_POSITIONS), targets.split(self.HEAD_POSITIONS), strict=True)
        ]
        loss, argmax, margin = (torch.cat(column) for column in zip(*parts, strict=True))
        return loss, argmax, margin


class NativeScorer:
    """A model's own ``core_score`` method; ``shares_prefixes`` read from the model."""

    def __init__(self, model: Any) -> None:
        self.score = model.core_score
        self.shares_prefixes = bool(getattr(model, "shares_prefixes", False))

    def __call__(self, prefix: Tensor, rows: Tensor, owner: Tensor, positions: Tensor) -> Any:
        return self.score(prefix, rows, owner, positions)


def _describe(value: Any) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__


def scorer_for(model: Any, device: torch.device) -> Scorer:
    """The scorer CORE uses for ``model`` (see the module docstring for the order)."""
    if callable(getattr(model, "core_score", None)):
        return NativeScorer(model)
    if callable(getattr(model, "hidden_ragged", None)) and callable(getattr(model, "head", None)):
        return RaggedScorer(model, device)
    if callable(getattr(model, "logits_after_prefix", None)):
        return SharedPrefixScorer(model, device)
    if callable(getattr(model, "logits_at", None)):
        return PositionLogitsScorer(model, device)
    return LogitsScorer(model, device)
