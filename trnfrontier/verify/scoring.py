"""The trusted side of running a served model: the scorer's functions, captured before anything runs.

``TrustedScorer.capture`` takes the trusted prepare module's functions and constants once,
before any archive code has started, and remembers the identity of every public attribute
(and of each function's code and defaults). Only those captured objects are called. The
archive's train.py never runs in this process (it runs in the sandboxed model server), so
``tampered()`` should always be empty; it is checked after every use anyway, because a
score is only worth what its scorer is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from trnfrontier.runtime import prepare_calls
from trnfrontier.untrusted.served import ServedModel, ServerError, remote_module
from trnfrontier.verify.modelcheck import check_model

EVAL_SEQ_LEN = int(prepare_calls.CONTRACT_DEFAULTS["EVAL_SEQ_LEN"])  # the contract's evaluation length, when a claim names none
EVAL_BATCH_SIZE = 4


def _identities(module: ModuleType) -> dict[str, tuple[int, int, int]]:
    return {
        name: (id(value), id(getattr(value, "__code__", None)), id(getattr(value, "__defaults__", None)))
        for name, value in vars(module).items()
        if not name.startswith("__")
    }


@dataclass
class TrustedScorer:
    module: ModuleType
    path: Path
    evaluate_bpb: Any
    ensure_tokenizer: Any
    vocab: int
    snapshot: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @classmethod
    def capture(cls, module: ModuleType, path: Path) -> TrustedScorer:
        return cls(module, path, getattr(module, "evaluate_bpb", None), getattr(module, "ensure_tokenizer", None),
                   int(prepare_calls.constant(module, "TOKENIZER_VOCAB_SIZE")), _identities(module))

    def tampered(self) -> list[str]:
        now = _identities(self.module)
        return sorted(n for n in set(now) | set(self.snapshot) if now.get(n) != self.snapshot.get(n))

    def _untouched(self) -> None:
        changed = self.tampered()
        if changed:
            raise ServerError(f"the trusted prepare module changed ({', '.join(changed[:4])}); the score is void")

    def tokenizer(self) -> Any:
        """The trusted ``ensure_tokenizer()``, through the one adapter (``runtime.prepare_calls``)."""
        self._untouched()
        return prepare_calls.ensure_tokenizer(self.module)

    def evaluate(self, served: ServedModel, tokenizer: Any, *, seq_len: int, tokens: int) -> dict[str, Any]:
        """The captured ``evaluate_bpb`` on the served model, called as the kit calls it (``prepare_calls``);
        the module is checked to still hold exactly the captured objects before and after."""
        model = remote_module(served)
        self._untouched()
        result = dict(prepare_calls.evaluate_bpb(self.module, model, tokenizer, EVAL_BATCH_SIZE, seq_len, "cpu",
                                                 split="public_val", max_tokens=tokens))
        self._untouched()
        return result


def contract_checks(served: ServedModel, *, vocab: int, seq_len: int, seed: int) -> dict[str, dict[str, Any]]:
    """modelcheck's judgements on the served model, plus hooks it registered while answering."""
    checks = check_model(served.forward, served.info, vocab=vocab, seq_len=seq_len, seed=seed)
    after = served.inspect()
    late = after.get("hooks") or []
    if checks["hooks"]["passed"] and late:
        checks["hooks"] = {"passed": False, "detail": "hooks registered during forward: " + "; ".join(map(str, late[:3]))}
    attempts = after.get("attempts") or []
    if checks["contained"]["passed"] and attempts:
        checks["contained"] = {"passed": False, "detail": f"train.py attempted {'; '.join(map(str, attempts[:3]))} while answering (blocked or contained by the sandbox)"}
    return checks
