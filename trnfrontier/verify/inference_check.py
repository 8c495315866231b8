"""Phase 2: does the archive's inference.py score with the trained model, and in time?

Two sandboxed servers hold the archive's model: one loaded by train.py's ``load_for_eval``
(the model val_bpb is scored from), one by inference.py's ``load_model`` (the model CORE
is scored through). Every judgement below is made here, on their outputs; neither can see
the other, and the probes are drawn afresh from ``seed`` for each verify run.

- consistent: on random token rows, on random shared prefixes (``next_token_logprobs_after``,
  asked last) and on rows of the CORE bundle (a random sample of its batches), inference.py's
  next-token distributions equal ``softmax(load_for_eval(...)(tokens))`` at every position:
  the total variation distance (half the L1 distance of the two distributions, the
  probability mass that moves) is at most ``TV_TOLERANCE``. Why 0.02: on a small trained
  model (``benchmarks/bench_inference_noise.py``) a batch of one moved nothing, the
  shared-prefix cache 8e-7, bfloat16 inference 0.010, weights 0.1% off 0.004, and one more
  optimizer step 0.68. So faster or lower-precision inference passes; another model, the
  checkpoint of a different run, or answers from a table fail it; random probes defeat
  any answer cache.
- causal and batch independent: a position's distribution does not move when later tokens
  change (to other tokens, to repeats, or are dropped), nor with the rest of the batch (the
  rows asked in batches of every smaller size); same tolerance, each its own reason.
- core-time: a small CORE run (``CORE_ITEMS_PER_TASK`` items per task of the bundle, or one
  more than the most shots a task takes) through
  inference.py with ``evaluate/core``, projected to the whole bundle at the launch's ranks
  against Phase 2's 60-minute limit. Measured on this CPU, so it errs long: over the limit
  here is reported, not failed (run ``trnf eval --core`` on the target to know). On the
  shipped format sample (``--core-bundle sample``, the default) it is skipped: the
  sample's items project nothing about the real bundle's time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trnfrontier import submission as fmt
from trnfrontier.contract.phases import Phase
from trnfrontier.untrusted.served import ServedModel, ServerError
from trnfrontier.verify.report import Check, failed, passed, skipped

TV_TOLERANCE = 0.02
PROBE_ROWS, PROBE_LENGTH = 4, 48
CORE_ITEMS_PER_TASK = 4
# Bundle batches whose log-probabilities are compared with the reference's (memory bound),
# drawn at random from all of the CORE run's.
COMPARED_BATCHES = 3
CONSISTENT, CAUSAL, BATCH = "consistent with load_for_eval", "causal", "batch independent"


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest total variation distance between two [..., vocab] log-probability tensors."""
    if a.shape != b.shape:
        return float("inf")
    return float(0.5 * (a.exp() - b.exp()).abs().sum(-1).max()) if a.numel() else 0.0


@dataclass
class Judge:
    """The worst distance seen per judgement, and where."""

    worst: dict[str, tuple[float, str]] = field(default_factory=dict)

    def see(self, what: str, distance: float, where: str) -> None:
        if distance > self.worst.get(what, (-1.0, ""))[0]:
            self.worst[what] = (distance, where)

    def failures(self) -> list[str]:
        return [f"{what} off by TV {d:.3g} at {where} (tolerance {TV_TOLERANCE})"
                for what, (d, where) in self.worst.items() if not d <= TV_TOLERANCE]

    def summary(self) -> str:
        return ", ".join(f"{what} TV <= {d:.2g}" for what, (d, _) in self.worst.items())


def probe_rows(vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (PROBE_ROWS, PROBE_LENGTH), generator=gen)


def judge_probes(reference: ServedModel, inference: ServedModel, vocab: int, seed: int, judge: Judge) -> None:
    """Consistency, causality and batch independence on random rows."""
    rows = probe_rows(vocab, seed)
    mine = inference.logprobs(rows)
    judge.see(CONSISTENT, total_variation(mine, log_softmax(reference.forward(rows))), "random probe rows")
    judge_causal(inference, rows, mine, random.Random(seed).randrange(1, PROBE_LENGTH), vocab, judge)
    judge_batch_independent(inference, rows, mine, judge)


def judge_causal(inference: ServedModel, rows: torch.Tensor, mine: torch.Tensor, cut: int, vocab: int, judge: Judge) -> None:
    """The distributions before ``cut`` must not move when what follows it changes: to other
    tokens, to the token before the cut repeated (a pattern random rows almost never hold, so a
    wrapper that peeks only at repeats passes every whole-row comparison), or to nothing."""
    shifted, repeated = rows.clone(), rows.clone()
    shifted[:, cut:] = (rows[:, cut:] + 1) % vocab
    repeated[:, cut:] = rows[:, cut - 1 : cut]
    for how, changed in (("other later tokens", shifted), ("later tokens repeating the one before", repeated)):
        judge.see(CAUSAL, total_variation(inference.logprobs(changed)[:, :cut], mine[:, :cut]), f"cut {cut}, {how}")
    judge.see(CAUSAL, total_variation(inference.logprobs(rows[:, :cut]), mine[:, :cut]), f"cut {cut}, later tokens dropped")


def judge_batch_independent(inference: ServedModel, rows: torch.Tensor, mine: torch.Tensor, judge: Judge) -> None:
    """Each row's distributions must not move with its batch: the rows asked in batches of every
    smaller size (so a wrapper that answers otherwise at one batch size is seen at it)."""
    count = rows.size(0)
    for size in range(1, count):
        parts = torch.cat([inference.logprobs(rows[i : i + size]) for i in range(0, count, size)])
        judge.see(BATCH, total_variation(parts, mine), f"rows in batches of {size} vs {count}")


def judge_shared_prefix(reference: ServedModel, inference: ServedModel, vocab: int, seed: int, judge: Judge) -> None:
    """The shared-prefix path CORE's choices go through, on random prefixes and rows. Asked after
    the CORE run, so a wrapper honest only for its first calls is seen."""
    gen, pick = torch.Generator().manual_seed(seed + 1), random.Random(seed + 1)
    groups, length = 2, pick.randrange(1, PROBE_LENGTH)
    prefix = torch.randint(0, vocab, (groups, length), generator=gen)
    rows = torch.randint(0, vocab, (PROBE_ROWS, PROBE_LENGTH - length), generator=gen)
    owner = (torch.arange(PROBE_ROWS) % groups)[torch.randperm(PROBE_ROWS, generator=gen)]
    expected = log_softmax(reference.forward(torch.cat((prefix.index_select(0, owner), rows), dim=1)))[:, length:]
    got = inference.logprobs_after(prefix, rows, owner)
    judge.see(CONSISTENT, total_variation(got, expected), f"random shared-prefix probe (prefix {length})")


class RemoteInference:
    """CORE's scoring protocol (``evaluate/core/protocol.py``) over the served inference.py,
    keeping ``COMPARED_BATCHES`` batches to compare with the reference afterwards: a reservoir
    sample of all its calls (drawn from the verify seed), so a wrapper cannot know from the
    call count which of its answers are checked."""

    def __init__(self, inference: ServedModel, seed: int = 0) -> None:
        self.inference = inference
        self.shares_prefixes = bool(inference.info.get("shares_prefixes", True))
        self.kept: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.calls = 0
        self._pick = random.Random(seed)

    def core_score(self, prefix: torch.Tensor, rows: torch.Tensor, owner: torch.Tensor, positions: torch.Tensor) -> Any:
        from trnfrontier.contract.inference import scores_at

        logprobs = self.inference.logprobs_after(prefix, rows, owner)
        self.calls += 1
        slot = len(self.kept) if len(self.kept) < COMPARED_BATCHES else self._pick.randrange(self.calls)
        if slot < COMPARED_BATCHES:
            entry = (self.calls, prefix, rows, owner, logprobs)
            self.kept[slot : slot + 1] = [entry]
        return scores_at(logprobs, rows, positions)


def judge_bundle(reference: ServedModel, remote: RemoteInference, judge: Judge) -> None:
    for call, prefix, rows, owner, logprobs in remote.kept:
        whole = torch.cat((prefix.index_select(0, owner), rows), dim=1) if prefix.size(1) else rows
        expected = log_softmax(reference.forward(whole))[:, prefix.size(1) :]
        judge.see(CONSISTENT, total_variation(logprobs, expected), f"CORE bundle batch {call} of {remote.calls}")


@dataclass(frozen=True)
class InferenceSetup:
    root: Path
    prepare: Path | None
    scratch: Path
    timeout: float
    sandboxed: bool
    seed: int
    tokenizer: Any  # the trusted prepare.py's, for rendering CORE items
    bundle: Any  # evaluate.core.fetch.ResolvedBundle, or None: no CORE run (and no projection)
    crop: int  # CORE rows are cropped to this context (the claimed evaluation length)
    bundle_problem: str = ""  # why there is no bundle, when there is none
    vocab_limit: int | None = None  # the widest logits either server may reply with (None: the server's default)


def _start(setup: InferenceSetup, name: str, inference_py: Path | None) -> ServedModel:
    scratch = setup.scratch / name
    scratch.mkdir(parents=True)
    served = ServedModel.start(root=setup.root, checkpoint=fmt.member_path(setup.root, fmt.EVAL_CHECKPOINT),
                               prepare=setup.prepare, scratch=scratch, timeout=setup.timeout,
                               sandboxed=setup.sandboxed, inference_py=inference_py)
    if setup.vocab_limit is not None:
        served.vocab_limit = setup.vocab_limit
    return served


def inference_checks(setup: InferenceSetup, phase: Phase, nproc: int) -> list[Check]:
    """The ``inference`` check (consistency, causality, batch independence) and ``core-time``."""
    path = fmt.member_path(setup.root, fmt.INFERENCE_PY)
    if not path.is_file():
        return [failed("inference", f"Phase {phase.number} archives carry inference.py (the wrapper CORE runs through); none here")]
    judge, report = Judge(), None
    try:
        with _start(setup, "reference", None) as reference, _start(setup, "inference", path) as inference:
            vocab = int(reference.forward(torch.zeros(1, 1, dtype=torch.long)).shape[-1])
            judge_probes(reference, inference, vocab, setup.seed, judge)
            if setup.bundle is not None:
                report = _mini_core(setup, inference, reference, judge)
            judge_shared_prefix(reference, inference, vocab, setup.seed, judge)
    except ServerError as exc:
        return [failed("inference", f"inference.py or load_for_eval failed (in the sandbox): {exc}"), _no_time("inference.py did not run")]
    bad = judge.failures()
    consistency = failed("inference", "; ".join(bad)) if bad else passed(
        "inference", f"inference.py matches load_for_eval ({judge.summary()}; tolerance {TV_TOLERANCE}; seed {setup.seed})")
    return [consistency, _time_check(report, phase, nproc) if report else _no_time(setup.bundle_problem or "no CORE bundle")]


def _mini_core(setup: InferenceSetup, inference: ServedModel, reference: ServedModel, judge: Judge) -> dict[str, Any]:
    from trnfrontier.evaluate.core.run import CoreOptions, evaluate_core

    remote = RemoteInference(inference, setup.seed)
    # Each item's shots come from the task's other items: a few more than the most shots.
    items = max(CORE_ITEMS_PER_TASK, 1 + max((t.num_fewshot for t in setup.bundle.bundle.tasks), default=0))
    options = CoreOptions(max_per_task=items, crop=setup.crop, crop_source="the claimed eval_seq_len")
    report = evaluate_core(setup.bundle, remote, setup.tokenizer, torch.device("cpu"), options)
    judge_bundle(reference, remote, judge)
    return report


def _no_time(why: str) -> Check:
    return skipped("core-time", f"no CORE time projection: {why}", required=False)


def _time_check(report: dict[str, Any], phase: Phase, nproc: int) -> Check:
    projection = report["projection"]
    limit = float(phase.core_timeout_seconds or projection["limit_seconds"])
    at = projection["seconds_at_ranks"].get(str(nproc))
    if at is None:
        return _no_time(f"the projection has no figure for {nproc} ranks")
    if report.get("format_sample"):
        # The sample's items are a format example, not CORE's: their count and lengths say nothing of the real run's time.
        return skipped("core-time", f"not a projection of the real CORE time: the bundle is the shipped format sample "
                       f"({projection['items_in_bundle']:,} items, {at / 60:.1f} min at {nproc} ranks here); "
                       "pass --core-bundle PATH|URL (the real CORE bundle) for a projection", required=False)
    line = (f"{report['max_per_task']} items per task through inference.py, projected to the bundle's "
            f"{projection['items_in_bundle']:,} items at {nproc} ranks: {at / 60:.1f} min of the {limit / 60:.0f}-minute limit "
            f"(bundle {report['bundle']}, measured on this CPU in the sandbox)")
    if at <= limit:
        return passed("core-time", line)
    return skipped("core-time", line + "; over here, but a CPU measurement errs long: run `trnf eval --core` on the target", required=False)
