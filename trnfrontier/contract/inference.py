"""The Phase 2 ``inference.py`` interface, as trnf infers it: the one module to change when
the organisers publish theirs.

The kit README says only that a submission adds an ``inference.py`` wrapper the scoring
infrastructure runs CORE through, in scoring mode (log-likelihoods of candidate
continuations, no generation), that it may change the inference implementation, KV cache
and kernels, and that it must stay consistent with the trained model. trnf assumes the
smallest interface that serves such a scorer (``docs/phase2.md``):

- ``load_model(checkpoint_path, device) -> model``;
- ``next_token_logprobs(model, tokens int64 [B, T]) -> float [B, T, vocab]``: at [b, t] the
  log-probabilities of the token after ``tokens[b, :t + 1]``;
- optional ``next_token_logprobs_after(model, prefix [G, P], rows [R, S], owner [R]) ->
  [R, S, vocab]``: the same for ``prefix[owner[r]] + rows[r]`` at the rows' positions,
  each prefix computed once (the shared context of a question's choices).

``InferenceModel`` holds a loaded inference.py and speaks CORE's scoring protocol
(``trnfrontier/evaluate/core``: ``core_score(prefix, rows, owner, positions) -> (loss,
argmax, margin)`` and ``shares_prefixes``), so ``trnf eval --core`` scores through it; the
sandboxed verify server (``untrusted/modelserver.py``) calls the same names. If the real
interface differs, the names and ``InferenceModel``'s three methods are what change.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

INFERENCE_FILE = "inference.py"
LOAD = "load_model"
LOGPROBS = "next_token_logprobs"
LOGPROBS_AFTER = "next_token_logprobs_after"


class InferenceError(RuntimeError):
    """An inference.py that lacks a name, fails, or returns what the interface does not."""


@contextmanager
def _importable(folder: Path, train_module: ModuleType | None) -> Iterator[None]:
    """``folder`` first on sys.path (so ``import train`` finds the train.py beside
    inference.py) or ``train_module`` standing in for train.py; both undone afterwards."""
    saved_train = sys.modules.get("train")
    sys.path.insert(0, str(folder))
    if train_module is not None:
        sys.modules["train"] = train_module
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        if saved_train is None:
            sys.modules.pop("train", None)
        else:
            sys.modules["train"] = saved_train


def import_inference(path: Path, train_module: ModuleType | None = None) -> ModuleType:
    """inference.py at ``path`` as a module, checked for the interface's names."""
    spec = importlib.util.spec_from_file_location(f"trnf_inference_{abs(hash(str(path)))}", path)
    if spec is None or spec.loader is None:
        raise InferenceError(f"{path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    with _importable(path.parent, train_module):
        spec.loader.exec_module(module)
    missing = [name for name in (LOAD, LOGPROBS) if not callable(getattr(module, name, None))]
    if missing:
        raise InferenceError(f"{path.name} does not define {' and '.join(missing)} (the inferred interface: docs/phase2.md)")
    return module


class InferenceModel:
    """A loaded inference.py: log-probabilities, and CORE's scoring protocol over them."""

    def __init__(self, module: ModuleType, model: Any) -> None:
        self.module, self.model = module, model
        self.shares_prefixes = callable(getattr(module, LOGPROBS_AFTER, None))

    def logprobs(self, tokens: Tensor) -> Tensor:
        """[B, T, vocab] float32 on the CPU, checked for shape."""
        out = getattr(self.module, LOGPROBS)(self.model, tokens)
        return _checked(out, (tokens.size(0), tokens.size(1)), LOGPROBS)

    def logprobs_after(self, prefix: Tensor, rows: Tensor, owner: Tensor) -> Tensor:
        """[R, S, vocab] for ``prefix[owner[r]] + rows[r]`` at the rows' positions."""
        if not self.shares_prefixes:
            whole = torch.cat((prefix.index_select(0, owner), rows), dim=1) if prefix.size(1) else rows
            return self.logprobs(whole)[:, prefix.size(1) :]
        out = getattr(self.module, LOGPROBS_AFTER)(self.model, prefix, rows, owner)
        return _checked(out, (rows.size(0), rows.size(1)), LOGPROBS_AFTER)

    @torch.no_grad()
    def core_score(self, prefix: Tensor, rows: Tensor, owner: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """CORE's scorer call (``scores_at`` of this file's log-probabilities)."""
        return scores_at(self.logprobs_after(prefix, rows, owner), rows, positions)


def scores_at(logprobs: Tensor, rows: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """CORE's scores from log-probabilities [R, S, vocab] of ``rows``: at each (r, j) of
    ``positions``, the loss of ``rows[r, j + 1]``, the greedy prediction and the top-2 margin."""
    r, j = positions[:, 0], positions[:, 1]
    at = logprobs[r, j]
    targets = rows[r, j + 1]
    loss = -at.gather(1, targets.unsqueeze(1)).squeeze(1)
    top = at.topk(2, dim=-1).values if at.size(-1) > 1 else torch.cat((at, at), dim=-1)
    return loss, at.argmax(dim=-1), (top[:, 0] - top[:, 1]).float()


def _checked(out: Any, leading: tuple[int, int], name: str) -> Tensor:
    if not isinstance(out, Tensor) or out.dim() != 3 or tuple(out.shape[:2]) != leading or not out.is_floating_point():
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise InferenceError(f"inference.py {name} returned {shape}, expected float log-probabilities [{leading[0]}, {leading[1]}, vocab]")
    return out.detach().to("cpu", torch.float32)


def load_inference(
    path: Path, checkpoint: str | Path, device: str | torch.device = "cpu", *, train_module: ModuleType | None = None
) -> InferenceModel:
    """Import inference.py and load ``checkpoint`` through its ``load_model``.
    ``train_module`` stands in for the train.py beside it (a run directory has none: its
    train.py's load_for_eval is ``runtime.checkpoint``'s)."""
    module = import_inference(Path(path), train_module)
    with _importable(Path(path).parent, train_module):
        model = getattr(module, LOAD)(str(checkpoint), device)
    return InferenceModel(module, model)
