"""``--rerun-eval``: the trusted ``evaluate_bpb`` rerun on the archive's model, with the evidence that the score is real.

The score is confirmed only when all of these hold, checked in this order:

1. the scored pass's own check rows (``mixing.MixedPass``) show a causal, batch-independent,
   stateless model: every splice and copy agrees with its scored window within tolerance;
2. after the pass, each of the two servers shows no late hooks, nothing the sandbox blocked,
   no limit it ran into, and the model it scored is the checkpoint's, tensor by tensor
   (``identity``);
3. no member of the archive carries the validation text just scored (``valtext``);
4. the trusted ``evaluate_bpb`` of that pass is the claim within ``RERUN_TOLERANCE``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnfrontier.untrusted.served import ServedModel
from trnfrontier.verify.claims import Claim, RerunSettings
from trnfrontier.verify.mixing import MixedPass
from trnfrontier.verify.scoring import VOCAB_SLACK, TrustedScorer, after_serving
from trnfrontier.verify.valtext import ScoredText, carried

RERUN_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Rerun:
    ok: bool
    line: str


def confirm(claim: Claim, settings: RerunSettings, scorer: TrustedScorer, tokenizer: Any,
            servers: Callable[[], contextlib.AbstractContextManager[list[ServedModel]]], *,
            checkpoint: Path, root: Path, names: list[str]) -> Rerun:
    """Rerun the score with two servers from ``servers()`` and judge it (ServerError and the scorer's
    own errors propagate to the caller, which words them). The pass's check rows are drawn from
    fresh secret randomness (``MixedPass.rng``), not from any seed the report prints."""
    with servers() as pair:
        mixed = MixedPass((pair[0], pair[1]), settings.batch_size, scorer.vocab + VOCAB_SLACK,
                          token_bytes=scorer.token_bytes())
        result = scorer.evaluate(mixed, tokenizer, seq_len=settings.seq_len, tokens=settings.tokens, batch_size=settings.batch_size)
        refused = mixed.evidence.verdict()
        if refused:
            return Rerun(False, f"the scored pass's check rows refuse the model: {refused}")
        for index, served in enumerate(pair):
            bad = [f"{name}: {v['detail']}" for name, v in after_serving(served, checkpoint).items() if not v["passed"]]
            if bad:
                return Rerun(False, f"server {index + 1} of the scored pass: {'; '.join(bad)}")
    found = carried(ScoredText(mixed.windows, scorer.vocab), root, names, tokenizer)
    if found:
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        return Rerun(False, f"the validation-text scan refuses the archive: {found[0]}{more}")
    got = float(result["val_bpb"])
    diff = abs(got - claim.val_bpb)
    line = (f"trusted evaluate_bpb (in verify's process; the model served from two sandboxes) gives {got:.6f}, claimed "
            f"{claim.val_bpb:.6f} (|diff| {diff:.2g}, tol {RERUN_TOLERANCE:g}; {settings.describe()}, batch {settings.batch_size}); "
            f"{mixed.evidence.describe()}; the model is the checkpoint's; no validation text in the archive")
    return Rerun(diff <= RERUN_TOLERANCE, line)


@contextlib.contextmanager
def closing_all(servers: list[ServedModel]) -> Iterator[list[ServedModel]]:
    try:
        yield servers
    finally:
        for served in servers:
            served.close()
