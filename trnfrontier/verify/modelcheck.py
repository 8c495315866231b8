"""The contract probe's judgements, made in verify's process on logits the sandboxed model returned.

The model only ever sees token tensors and answers with logits; every comparison below
happens here, where no archive code runs, so a model cannot tamper with its judge.

- causal: at the evaluation sequence length the claim used (1024 by contract), the tokens
  from a cut point on are replaced, at several random cut points plus the last position;
  the logits before each cut must not move.
- batch independent: the same rows give the same logits alone (batch 1), in a batch of 8,
  in that batch permuted with half its rows perturbed, and among 32 rows; the length of
  these rows is bounded so that 32 rows of logits stay within a memory budget.
- deterministic and finite: two identical forwards agree and hold no NaN or inf.

Every comparison is of log-probabilities (log-softmax, in float64), within ``TOL_POSITION``
nats (``mixing.TOL_POSITION``, the tolerance the scored pass uses): adding a constant to a
position's logits changes nothing, so no output scale can widen the tolerance; values
below ``-LOGP_FLOOR`` (a probability under e^-50, a sentinel on a special token) are
compared as equal, since they carry no score.
- eval mode, no hooks, prepare untouched, contained: what the server saw on the loaded model,
  and what train.py tried that the sandbox blocked (writes outside its temp dir, sockets,
  processes). A hostile server can lie here; the output checks above cannot be faked.
"""

from __future__ import annotations

import random
from typing import Any

from trnfrontier.verify.mixing import TOL_POSITION

LOGP_FLOOR = 50.0
CUT_POINTS = 4
BATCH_SIZES = (1, 8, 32)
LOGITS_BUDGET_BYTES = 64 << 20
MIN_BATCH_LENGTH = 16


def _verdict(ok: bool, detail: str) -> dict[str, Any]:
    return {"passed": bool(ok), "detail": detail}


def batch_length(seq_len: int, vocab: int, budget: int = LOGITS_BUDGET_BYTES) -> int:
    """The row length for the batch checks: ``seq_len``, or less so that 32 rows of logits fit ``budget``."""
    fits = budget // (max(BATCH_SIZES) * vocab * 4)
    return max(min(seq_len, MIN_BATCH_LENGTH), min(seq_len, fits))


def _perturb(rows: Any, start: int, vocab: int, gen: Any) -> Any:
    """``rows`` with every token from ``start`` on changed to a different one."""
    import torch

    out = rows.clone()
    shift = 1 + torch.randint(0, vocab - 1, out[:, start:].shape, generator=gen)
    out[:, start:] = (out[:, start:] + shift) % vocab
    return out


def _logp(logits: Any) -> Any:
    import torch

    return torch.log_softmax(logits.double(), dim=-1).clamp_min(-LOGP_FLOOR)


def _diff(a: Any, b: Any) -> float:
    """The largest difference of log-probabilities between two logits tensors of the same shape (nats)."""
    if not a.numel():
        return 0.0
    d = (_logp(a) - _logp(b)).abs().max()
    return float(d) if bool(d.isfinite()) else float("inf")


def causality(forward: Any, vocab: int, seq_len: int, gen: Any, rng: random.Random, tol: float, base_x: Any, base: Any) -> dict[str, Any]:
    cuts = sorted({seq_len - 1, *(rng.randrange(1, seq_len) for _ in range(CUT_POINTS))}) if seq_len > 1 else []
    worst, where = 0.0, None
    for cut in cuts:
        diff = _diff(forward(_perturb(base_x, cut, vocab, gen))[:, :cut], base[:, :cut])
        if diff > worst:
            worst, where = diff, cut
    detail = f"T={seq_len}, cuts {cuts}: max |d log p| of earlier positions {worst:.3g} nats" + (f" (at cut {where})" if worst > tol else "")
    return _verdict(worst <= tol, detail)


def batch_independence(forward: Any, vocab: int, length: int, gen: Any, rng: random.Random, tol: float) -> dict[str, Any]:
    import torch

    rows = torch.randint(0, vocab, (8, length), generator=gen)
    ref = forward(rows)
    worst, where = 0.0, ""

    def note(diff: float, what: str) -> None:
        nonlocal worst, where
        if diff > worst:
            worst, where = diff, what

    for i in sorted({0, rng.randrange(1, 8)}):
        note(_diff(forward(rows[i:i + 1])[0], ref[i]), f"row {i} alone (batch 1)")
    order = list(range(8))
    rng.shuffle(order)
    kept = set(rng.sample(range(8), 4))
    mixed = torch.stack([rows[j] if j in kept else _perturb(rows[j:j + 1], length // 2, vocab, gen)[0] for j in order])
    out = forward(mixed)
    for slot, j in enumerate(order):
        if j in kept:
            note(_diff(out[slot], ref[j]), f"row {j} in a permuted batch of 8 with 4 rows perturbed")
    slots = rng.sample(range(32), 8)
    big = torch.randint(0, vocab, (32, length), generator=gen)
    for j, slot in enumerate(slots):
        big[slot] = rows[j]
    out = forward(big)
    for j, slot in enumerate(slots):
        note(_diff(out[slot], ref[j]), f"row {j} among 32")
    detail = f"batches {list(BATCH_SIZES)} at T={length}, rows permuted and perturbed: max |d log p| {worst:.3g} nats" + (f" ({where})" if worst > tol else "")
    return _verdict(worst <= tol, detail)


def _server_checks(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    changed = [str(n) for n in info.get("prepare_changed") or []]
    hooks = [str(h) for h in info.get("hooks") or []]
    training = [str(t) for t in info.get("training") or []]
    attempts = [str(a) for a in info.get("attempts") or []]
    return {
        "contained": _verdict(not attempts, f"train.py attempted {'; '.join(attempts[:3])} (blocked or contained by the sandbox)" if attempts else "no write outside its temp dir, no socket, no process"),
        "prepare_untouched": _verdict(not changed, f"train.py changed prepare.{', prepare.'.join(changed[:4])} while loading (the scorer never uses that copy; still a rejection)" if changed else "prepare's public names unchanged after import and load_for_eval"),
        "hooks": _verdict(not hooks, "; ".join(hooks[:3]) or "no hooks"),
        "eval_mode": _verdict(not training, f"in training mode: {', '.join(training[:3])}" if training else "eval mode"),
    }


def check_model(forward: Any, info: dict[str, Any], *, vocab: int, seq_len: int, seed: int) -> dict[str, dict[str, Any]]:
    """Every contract check on a model reachable only through ``forward`` (tokens -> float32 logits)."""
    import torch

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    checks = _server_checks(info)
    base_x = torch.randint(0, vocab, (1, seq_len), generator=gen)  # one row: the batch checks cover rows
    base = forward(base_x)
    wide = base.shape[-1] >= vocab
    checks["vocabulary"] = _verdict(wide, f"logits over {base.shape[-1]} tokens" + ("" if wide else f", fewer than the vocabulary's {vocab}"))
    if not wide:
        return checks
    finite = bool(torch.isfinite(base).all())
    checks["finite"] = _verdict(finite, "logits are finite" if finite else "logits contain NaN or inf")
    if not finite:
        return checks

    tol = TOL_POSITION
    again = _diff(forward(base_x), base)
    checks["deterministic"] = _verdict(again <= tol, f"max |d log p| between two identical forwards {again:.3g} nats")
    checks["causal"] = causality(forward, vocab, seq_len, gen, rng, tol, base_x, base)
    checks["batch_independent"] = batch_independence(forward, vocab, batch_length(seq_len, vocab), gen, rng, tol)
    return checks
