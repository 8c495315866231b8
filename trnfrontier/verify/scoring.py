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
from trnfrontier.verify.identity import compare
from trnfrontier.verify.modelcheck import check_model

# Logits may be wider than the vocabulary by a little (a width padded to a multiple of 64, say);
# never by more, so that what verify allocates for one reply stays bounded by the vocabulary.
VOCAB_SLACK = 1024


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

    def token_bytes(self) -> Any:
        """The trusted ``get_token_bytes('cpu')`` (bytes of each token; 0 for the specials), or None."""
        self._untouched()
        try:
            return prepare_calls.call(self.module, "get_token_bytes", "cpu")
        except Exception:  # noqa: BLE001 - an older prepare.py without it: every position is compared
            return None

    def evaluate(self, forward: Any, tokenizer: Any, *, seq_len: int, tokens: int, batch_size: int) -> dict[str, Any]:
        """The captured ``evaluate_bpb`` on a model whose forward is ``forward`` (tokens -> logits: a
        served model, or ``MixedPass``), called as the kit calls it (``prepare_calls``); the module is
        checked to still hold exactly the captured objects before and after."""
        model = remote_module(forward)
        self._untouched()
        result = dict(prepare_calls.evaluate_bpb(self.module, model, tokenizer, batch_size, seq_len, "cpu",
                                                 split="public_val", max_tokens=tokens))
        self._untouched()
        return result


def _verdict(ok: bool, detail: str) -> dict[str, Any]:
    return {"passed": bool(ok), "detail": detail}


def after_serving(served: ServedModel, checkpoint: Path) -> dict[str, dict[str, Any]]:
    """What a server shows once it has answered: hooks it registered late, what train.py tried that the
    sandbox blocked, a filled tmpfs or a tree limit it ran into, and whether the model it served is
    the checkpoint's (``identity.compare``)."""
    after = served.inspect()
    late = [str(h) for h in after.get("hooks") or []]
    attempts = [str(a) for a in after.get("attempts") or []]
    filled = [str(f) for f in after.get("filled") or []]
    breach = served.breach()
    identity = compare(served.tensors(), checkpoint)
    limits = ([f"ran into {breach}"] if breach else []) + [f"filled {f}, the sandbox's limit" for f in filled]
    return {
        "hooks": _verdict(not late, "hooks registered during forward: " + "; ".join(late[:3]) if late else "no hooks"),
        "contained": _verdict(not attempts, f"train.py attempted {'; '.join(attempts[:3])} while answering (blocked or contained by the sandbox)"
                              if attempts else "nothing blocked"),
        "limits": _verdict(not limits, "the sandboxed code " + "; ".join(limits) if limits else "within the sandbox's limits"),
        "checkpoint": _verdict(identity.ok, "; ".join(identity.problems[:2]) if identity.problems else identity.describe()),
    }


def contract_checks(served: ServedModel, *, vocab: int, seq_len: int, seed: int, checkpoint: Path) -> dict[str, dict[str, Any]]:
    """modelcheck's judgements on the served model, then ``after_serving``'s."""
    checks = check_model(served.forward, served.info, vocab=vocab, seq_len=seq_len, seed=seed)  # replies bounded by served.vocab_limit
    for name, verdict in after_serving(served, checkpoint).items():
        if name not in checks or (checks[name]["passed"] and not verdict["passed"]):
            checks[name] = verdict
    return checks
