"""inference.py: this submission's model as the Phase 2 scorer runs CORE through it.

Written by trnf (``trnf init --phase 2``, ``trnf package`` of a Phase 2 run); yours to edit.
The organisers' interface is not public: this file implements the one trnf infers
(docs/phase2.md in trnfrontier); trnf's adapter, ``trnfrontier/contract/inference.py``, is
the one place that maps it to the real one when it is published.

    load_model(checkpoint_path, device) -> model
        the model train.py's load_for_eval returns, ready for scoring;
    next_token_logprobs(model, tokens) -> logprobs
        tokens int64 [B, T] -> float32 [B, T, vocab]: at [b, t] the log-probabilities of
        the token that follows tokens[b, :t + 1];
    next_token_logprobs_after(model, prefix, rows, owner) -> logprobs      (optional)
        the same for the sequences prefix[owner[r]] + rows[r] (prefix [G, P], rows [R, S],
        owner [R]) at the rows' positions only: [R, S, vocab]. Each prefix row is computed
        once for every row that continues it (the shared context of a question's choices,
        held as keys and values: a KV cache).

It must stay the trained model, scored as load_for_eval scores it: ``trnf verify`` compares
its log-probabilities with log_softmax(load_for_eval(...)(tokens)) on random token rows,
checks that they are causal and do not depend on the rest of the batch, and projects its
CORE time against the 60-minute limit. Faster inference (kernels, bfloat16, another cache)
is allowed; answers that come from anything but the model are not.
"""

from __future__ import annotations

from typing import Any

import torch


def load_model(checkpoint_path: str, device: Any = "cpu") -> torch.nn.Module:
    """The checkpoint's model, as this submission's train.py loads it for evaluation."""
    import train  # the train.py beside this file

    return train.load_for_eval(checkpoint_path, device)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def next_token_logprobs(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """float32 [B, T, vocab]: log-probabilities of the next token at every position."""
    logits = model(tokens.to(_device(model)))
    return torch.log_softmax(logits.float(), dim=-1)


@torch.no_grad()
def next_token_logprobs_after(
    model: torch.nn.Module, prefix: torch.Tensor, rows: torch.Tensor, owner: torch.Tensor
) -> torch.Tensor:
    """float32 [R, S, vocab] for the sequences prefix[owner[r]] + rows[r], at the rows'
    positions; each prefix row computed once when the model can (logits_after_prefix)."""
    device = _device(model)
    prefix, rows, owner = prefix.to(device), rows.to(device), owner.to(device)
    count, length = rows.shape
    shared = getattr(model, "logits_after_prefix", None)
    if shared is None or prefix.size(1) == 0:
        whole = torch.cat((prefix.index_select(0, owner), rows), dim=1) if prefix.size(1) else rows
        return next_token_logprobs(model, whole)[:, prefix.size(1) :]
    at_rows = torch.arange(count, device=device).repeat_interleave(length)
    at_cols = torch.arange(length, device=device).repeat(count)
    logits = shared(prefix, rows, owner, at_rows, at_cols)
    return torch.log_softmax(logits.float(), dim=-1).view(count, length, -1)
