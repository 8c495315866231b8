"""A CORE bundle on a model: every task, sharded over ranks, one collective, one report.

For each task (in ``core.yaml`` order) the items are shuffled and subsampled as nanochat
does; rank r of W scores items r, r + W, ...; after the last task every rank's verdicts,
near-tie flags and seconds travel in one ``all_gather_object`` (a failure on one rank
travels the same way, so no rank waits on a collective alone). Then, as nanochat:
accuracy is a float32 mean of the 0/1 verdicts, centered = (accuracy - b/100) / (1 - b/100)
for the random baseline b (percent), CORE = the mean of centered over tasks.

The projection: each task's measured seconds per item (summed over ranks: the cost on one
rank) times the task's items in the whole bundle, divided by the ranks (this run's, and
those of Phase 2's launch shapes), against Phase 2's CORE time limit on the full server
(compilation excluded there; included here, so the projection errs long). It is only as
good as the device it was measured on: a CPU measurement says little about a NeuronCore.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trnfrontier.contract.phases import phase
from trnfrontier.errors import TrnfError
from trnfrontier.evaluate.core import render
from trnfrontier.evaluate.core.bundle import Bundle, Task, read_bundle
from trnfrontier.evaluate.core.engine import score_rows, task_rows
from trnfrontier.evaluate.core.fetch import ResolvedBundle
from trnfrontier.evaluate.core.job import DEFAULT_BATCH_TOKENS, CoreJob
from trnfrontier.evaluate.core.protocol import scorer_for
from trnfrontier.evaluate.core.scoring import tolerance_for
from trnfrontier.progress import Steps

PHASE2 = phase(2)


@dataclass(frozen=True)
class CoreOptions:
    max_per_task: int | None = None  # None: every item (the full metric)
    crop: int | None = None
    crop_source: str = "none"
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    share_prefixes: bool | None = None  # None: when the scorer can
    project_ranks: tuple[int, ...] = tuple(s.nproc for s in PHASE2.launch_shapes)  # besides this run's


def crop_length(model: Any, requested: int | None, source: str) -> tuple[int | None, str]:
    """nanochat crops at ``model.max_seq_len`` when the model declares one; else ``requested``."""
    declared = getattr(model, "max_seq_len", None)
    if declared is not None:
        return int(declared), "model.max_seq_len"
    return requested, source


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(local: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``local`` on every rank: the run's one collective (over gloo, which
    carries Python objects whatever backend the model's ranks use)."""
    import torch.distributed as dist

    rank, world = _rank_and_world()
    if world == 1:
        return [local]
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    out: list[Any] = [None] * world
    dist.all_gather_object(out, local, group=group)
    return out


def _in_scoring_order(bundle: Bundle, task: Task, max_per_task: int | None) -> tuple[int, list[dict[str, Any]], list[str]]:
    """(items in the bundle, the scored items in scoring order, the ``file:line`` of each)."""
    in_bundle = bundle.items(task)
    order = render.shuffled_order(len(in_bundle), max_per_task)
    return len(in_bundle), [in_bundle[k] for k in order], [bundle.origin(task, k) for k in order]


def check_continuations(bundle: Bundle, tokenizer: Any, max_per_task: int | None) -> None:
    """Refuse, naming ``file:line``, a language-modeling item whose prompt without its
    continuation does not tokenize to a prefix of the prompt with it: no model is needed
    to find one, so a worker finds it before loading the model. (Crop failures wait for
    the model: its own ``max_seq_len`` may set the crop.)"""
    for task in bundle.tasks:
        if task.kind == "language_modeling":
            _count, items, origins = _in_scoring_order(bundle, task, max_per_task)
            task_rows(task, items, list(range(len(items))), tokenizer, None, origins)


def _score_task(task: Task, bundle: Bundle, scorer: Any, options: CoreOptions, tokenizer: Any,
                tolerance: float, share: bool, bar: Steps) -> dict[str, Any]:
    """This rank's verdicts of one task."""
    in_bundle, items, origins = _in_scoring_order(bundle, task, options.max_per_task)
    rank, world = _rank_and_world()
    mine = list(range(rank, len(items), world))
    started = time.perf_counter()
    rows = task_rows(task, items, mine, tokenizer, options.crop, origins)
    reported = 0

    def on_rows(done: int, total: int) -> None:
        nonlocal reported
        now = len(mine) * done // max(total, 1)
        bar.advance(now - reported)
        reported = now
        bar.describe(f"CORE {task.label}: {now}/{len(mine)} items")

    bar.describe(f"CORE {task.label}: 0/{len(mine)} items")
    verdicts = score_rows(scorer, rows, batch_tokens=options.batch_tokens, tolerance=tolerance, share_prefixes=share, on_rows=on_rows)
    bar.advance(len(mine) - reported)
    return {
        "in_bundle": in_bundle,
        "indices": mine,
        "correct": [v.correct for v in verdicts],
        "near": [v.near_tie for v in verdicts],
        "seconds": time.perf_counter() - started,
    }


def _local_results(resolved: ResolvedBundle, model: Any, tokenizer: Any, device: torch.device, options: CoreOptions,
                   bar: Steps) -> dict[str, Any]:
    scorer = scorer_for(model, device)
    share = bool(getattr(scorer, "shares_prefixes", False)) if options.share_prefixes is None else options.share_prefixes
    dtype = next((p.dtype for p in model.parameters()), torch.float32) if isinstance(model, torch.nn.Module) else torch.float32
    tolerance = tolerance_for(dtype)
    local: dict[str, Any] = {"tasks": {}, "tolerance": tolerance, "error": None}
    try:
        for task in resolved.bundle.tasks:
            local["tasks"][task.label] = _score_task(task, resolved.bundle, scorer, options, tokenizer, tolerance, share, bar)
    except TrnfError as exc:
        local["error"] = str(exc)
    return local


def evaluate_core(resolved: ResolvedBundle, model: Any, tokenizer: Any, device: torch.device, options: CoreOptions,
                  progress: Steps | None = None) -> dict[str, Any]:
    """The CORE report of ``model`` on ``resolved`` (every rank returns the same one)."""
    bar = progress or Steps.none()
    started = time.perf_counter()
    with torch.no_grad():
        local = _local_results(resolved, model, tokenizer, device, options, bar)
    everyone = _gather(local)
    failed = [(rank, r["error"]) for rank, r in enumerate(everyone) if r["error"]]
    if failed:
        rank, message = failed[0]
        raise TrnfError(message if len(everyone) == 1 else f"rank {rank}: {message}")
    return _report(resolved, options, everyone, time.perf_counter() - started)


def _task_report(task: Any, everyone: list[dict[str, Any]], items_scored: int) -> dict[str, Any]:
    correct = torch.zeros(items_scored, dtype=torch.float32)
    near = 0
    seconds = 0.0
    for local in everyone:
        part = local["tasks"][task.label]
        for index, ok, tie in zip(part["indices"], part["correct"], part["near"], strict=True):
            correct[index] = float(ok)
            near += int(tie)
        seconds += part["seconds"]
    accuracy = correct.mean().item()  # float32, as nanochat's
    baseline = task.baseline
    return {
        "accuracy": accuracy,
        "centered": (accuracy - 0.01 * baseline) / (1.0 - 0.01 * baseline),
        "items": items_scored,
        "type": task.kind,
        "num_fewshot": task.num_fewshot,
        "random_baseline": baseline,
        "near_ties": near,
        "rank_seconds": seconds,
    }


def _report(resolved: ResolvedBundle, options: CoreOptions, everyone: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    tasks, projected = {}, 0.0
    for task in resolved.bundle.tasks:
        items_scored = sum(len(local["tasks"][task.label]["indices"]) for local in everyone)
        report = _task_report(task, everyone, items_scored)
        in_bundle = everyone[0]["tasks"][task.label]["in_bundle"]
        report["items_in_bundle"] = in_bundle
        projected += report["rank_seconds"] / max(items_scored, 1) * in_bundle
        tasks[task.label] = report
    world = len(everyone)
    ranks = sorted({world, *options.project_ranks})
    return {
        "core_metric": sum(t["centered"] for t in tasks.values()) / len(tasks),
        "tasks": tasks,
        "bundle_sha256": resolved.sha256,
        "bundle_sha256_of": resolved.sha256_of,
        "bundle": resolved.source,
        "bundle_pinned": resolved.pinned,
        "format_sample": resolved.sample,
        "seconds": seconds,
        "full_metric": not options.max_per_task,
        "max_per_task": options.max_per_task,
        "crop": options.crop,
        "crop_source": options.crop_source,
        "batch_tokens": options.batch_tokens,
        "world_size": world,
        "near_ties": sum(t["near_ties"] for t in tasks.values()),
        "near_tie_tolerance": everyone[0]["tolerance"],
        "projection": {
            "limit_seconds": PHASE2.core_timeout_seconds,
            "items_in_bundle": sum(t["items_in_bundle"] for t in tasks.values()),
            "rank_seconds": projected,
            "seconds_at_ranks": {str(r): projected / r for r in ranks},
        },
    }


def check_job(job: dict[str, Any], tokenizer: Any) -> None:
    """``check_continuations`` on the job a parent sent, before the model loads."""
    spec = CoreJob(**job)
    check_continuations(read_bundle(Path(spec.bundle_root)), tokenizer, spec.max_per_task)


def run_job(job: dict[str, Any], model: Any, tokenizer: Any, device: torch.device, progress: Steps | None = None) -> dict[str, Any]:
    """The CORE report of ``model`` for the job a parent sent (``CoreJob.to_dict()``)."""
    spec = CoreJob(**job)
    resolved = ResolvedBundle(
        bundle=read_bundle(Path(spec.bundle_root)),
        sha256=spec.bundle_sha256,
        sha256_of=spec.bundle_sha256_of,
        source=spec.bundle_source,
        pinned=spec.bundle_pinned,
        sample=spec.format_sample,
    )
    crop, source = crop_length(model, spec.crop, spec.crop_source)
    options = CoreOptions(max_per_task=spec.max_per_task, crop=crop, crop_source=source, batch_tokens=spec.batch_tokens)
    return evaluate_core(resolved, model, tokenizer, device, options, progress)
