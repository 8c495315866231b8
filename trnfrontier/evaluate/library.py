"""The library behind `trnf eval`: the scorer's number for one or more checkpoints.

Each checkpoint is scored in a fresh process (``trnfrontier.evaluate.worker``) by the trusted
``evaluate_bpb`` of the selected prepare.py, after the contract's causality check and a
batch-independence check. The evaluation length, context and batch size default to the
ones the trainer used for that run (its summary.json, else the recipe recorded with the
checkpoint), so the number printed here is the number the trainer recorded; without a
record they are the contract's public defaults.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trnfrontier import processes
from trnfrontier.child_env import child_env
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.evaluate.spec import WorkerSpec
from trnfrontier.progress import Steps, relay
from trnfrontier.runtime import host_memory
from trnfrontier.runtime.checkpoint_ref import resolve_checkpoint
from trnfrontier.runtime.integrity import (
    DamagedFileError,
    check_file,
    check_recorded_sha256,
    check_weights,
)
from trnfrontier.runtime.prepare_calls import constant, missing_names
from trnfrontier.runtime.recipe import DEFAULT_PHASE
from trnfrontier.runtime.rundir import FINAL_DIR, RECIPE_FILE, SUMMARY_FILE
from trnfrontier.submission import INFERENCE_PY
from trnfrontier.trusted_prepare import load_contract

# Seconds the worker may spend beyond the evaluation timeout before it is killed: model
# load, the two checks and interpreter start-up. evaluate_bpb itself stops at the timeout.
LOAD_GRACE_SECONDS = 300.0
if TYPE_CHECKING:
    from trnfrontier.evaluate.core.job import CoreSetup

# The contract's eval_public default, used when nothing is recorded.
DEFAULT_BATCH_SIZE = 8


@dataclass
class EvalOptions:
    """What the command line chose; ``None`` means "as recorded, else the contract's default"."""

    tokens: str | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    device: str = "auto"
    timeout: float | None = None
    allow_mismatch: bool = False
    sample_tokens: int = 0
    prompt: str = ""
    temperature: float = 0.8
    threads: int | None = None
    nproc: int = 1  # processes per target (torchrun): they share CORE's items and the validation rows
    core: CoreSetup | None = None  # also score CORE (evaluate.core.job.prepare_core)


@dataclass(frozen=True)
class Target:
    """One thing to score: a trnf checkpoint path, or a kit train.py with its checkpoint."""

    path: Path
    train_py: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.path} (via {self.train_py.name})" if self.train_py else str(self.path)


def parse_tokens(value: str, prepare: Any) -> int:
    """``public`` (2,097,152), ``official`` (20,971,520) or a positive count (``_`` allowed)."""
    presets = {"public": constant(prepare, "EVAL_TOKENS_PUBLIC"), "official": constant(prepare, "EVAL_TOKENS_OFFICIAL")}
    if value.lower() in presets:
        return int(presets[value.lower()])
    try:
        count = int(value.replace("_", ""))
    except ValueError:
        raise UsageError(f"--tokens {value!r}: give public, official or a number of tokens") from None
    if count < 1:
        raise UsageError(f"--tokens {value}: must be positive")
    return count


def check_device(name: str) -> None:
    """Refuse a --device name torch cannot parse, before any worker starts (whether the
    device is present is the worker's to find out, where it loads the model)."""
    if re.fullmatch(r"auto|(cpu|cuda|neuron)(:\d+)?", name):
        return
    import torch

    try:
        torch.device(name)
    except RuntimeError:
        raise UsageError(
            f"--device {name}: unknown device; use cpu, cuda, neuron or auto (or an indexed one, e.g. cuda:1)"
        ) from None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def recorded_settings(path: Path) -> dict[str, Any]:
    """The eval length/context/batch the trainer used for this checkpoint's run, its score,
    and the SHA256s recorded with the checkpoint."""
    found: dict[str, Any] = {}
    try:
        ref = resolve_checkpoint(path)
    except FileNotFoundError:
        return found  # nothing to score either: the worker says so
    run_dir = ref.run_dir
    summary = _read_json(run_dir / SUMMARY_FILE) if run_dir else None
    meta = ref.meta()
    recipe: dict[str, Any] = (meta or {}).get("recipe") or (_read_json(run_dir / RECIPE_FILE) if run_dir else None) or {}
    eval_section: dict[str, Any] = recipe["eval"] if isinstance(recipe.get("eval"), dict) else {}
    for key, summary_key in (("tokens", "eval_tokens"), ("seq_len", "eval_seq_len"), ("batch_size", "eval_batch_size")):
        if run_dir is not None and summary and summary.get(summary_key):
            found[key] = int(summary[summary_key])
            found[f"{key}_source"] = f"{run_dir / SUMMARY_FILE}"
        elif eval_section.get(key):
            found[key] = int(eval_section[key])
            found[f"{key}_source"] = "recipe recorded with the checkpoint"
    found["phase"] = recipe.get("phase", DEFAULT_PHASE)
    model_section: dict[str, Any] = recipe["model"] if isinstance(recipe.get("model"), dict) else {}
    if model_section.get("sequence_len"):
        found["train_seq_len"] = int(model_section["sequence_len"])
    if summary and ref.is_final and summary.get("val_bpb") is not None:
        found["recorded_val_bpb"] = summary["val_bpb"]
    if meta:
        found["shas"] = {key: meta.get(key) for key in ("prepare_sha256", "tokenizer_sha256")}
    return found


def worker_spec(target: Target, options: EvalOptions, prepare: Any) -> WorkerSpec:
    """The settings one worker runs with, each with where it came from."""
    recorded = recorded_settings(target.path)
    if options.tokens is not None:
        tokens, tokens_source = parse_tokens(options.tokens, prepare), "--tokens"
    else:
        tokens = recorded.get("tokens", int(constant(prepare, "EVAL_TOKENS_PUBLIC")))
        tokens_source = recorded.get("tokens_source", "contract EVAL_TOKENS_PUBLIC")
    if options.seq_len is not None:
        seq_len, seq_source = options.seq_len, "--seq-len"
    else:
        seq_len = recorded.get("seq_len", int(constant(prepare, "EVAL_SEQ_LEN")))
        seq_source = recorded.get("seq_len_source", "contract EVAL_SEQ_LEN")
    batch_size = options.batch_size or recorded.get("batch_size", DEFAULT_BATCH_SIZE)
    timeout = options.timeout if options.timeout is not None else float(constant(prepare, "EVAL_TIMEOUT_SECONDS"))
    return WorkerSpec(
        path=str(target.path),
        train_py=str(target.train_py) if target.train_py else None,
        checkpoint=str(target.path) if target.train_py else None,
        tokens=tokens,
        tokens_source=tokens_source,
        seq_len=seq_len,
        seq_len_source=seq_source,
        batch_size=batch_size,
        device=options.device,
        timeout=timeout,
        allow_mismatch=options.allow_mismatch,
        sample_tokens=options.sample_tokens,
        prompt=options.prompt,
        temperature=options.temperature,
        threads=options.threads,
        # The trainer's number measures these settings only: compared at others, a difference
        # would say nothing about the checkpoint ("DIFFERENT" for --tokens 131072 on a run of 16,384).
        recorded_val_bpb=recorded.get("recorded_val_bpb")
        if (tokens, seq_len, batch_size) == (recorded.get("tokens"), recorded.get("seq_len"), recorded.get("batch_size"))
        else None,
        recorded_shas=recorded.get("shas") if target.train_py else None,
        nproc=options.nproc,
        core=options.core.job(options.seq_len, recorded.get("train_seq_len"), int(constant(prepare, "EVAL_SEQ_LEN"))) if options.core else None,
        inference_py=core_inference_py(target, recorded) if options.core else None,
    )


def core_inference_py(target: Target, recorded: dict[str, Any]) -> str | None:
    """The inference.py CORE runs through, as the Phase 2 scorer would: a kit train.py's
    sibling inference.py; for a Phase 2 run, the one `trnf package` ships with it."""
    if target.train_py is not None:
        beside = target.train_py.parent / INFERENCE_PY
        return str(beside) if beside.is_file() else None
    if recorded.get("phase", DEFAULT_PHASE) != DEFAULT_PHASE:
        from trnfrontier.contract.inference_source import TEMPLATE

        return str(TEMPLATE)
    return None


def check_paths(targets: list[Target]) -> None:
    """Every path names something to score, before anything claims to start: a typo is
    refused in a moment, not after a worker has loaded torch."""
    problems = []
    for target in targets:
        if target.train_py is None:
            try:
                resolve_checkpoint(target.path)
            except FileNotFoundError as exc:
                problems.append(str(exc))
            continue
        if not target.train_py.is_file():
            problems.append(f"--train-py {target.train_py}: no such file")
        if not target.path.exists():
            problems.append(f"--checkpoint {target.path}: no such file")
    if problems:
        raise UsageError(f"{'; '.join(problems)}; nothing was scored")


def check_target(target: Target) -> dict[str, Any]:
    """The checkpoint's files against the manifest that recorded them, before any worker
    starts (a kit train.py's load_for_eval checks nothing): ``{"integrity": what was
    checked, or None when nothing records the file}``, or ``{"error": ...}`` naming the
    damaged file and the repair."""
    try:
        weights = target.path if target.train_py else resolve_checkpoint(target.path).model_file
    except FileNotFoundError:
        return {"integrity": None}  # nothing to score either: the worker says so
    try:
        checked = check_weights(weights)
        if checked is None and target.train_py is not None:
            checked = _check_kit_record(weights)
        return {"integrity": checked}
    except DamagedFileError as exc:
        return {"error": f"{exc}; {_repair(exc.path)}", "error_kind": "damaged"}


def _check_kit_record(checkpoint: Path) -> str | None:
    """A kit checkpoint no manifest records, against the SHA256 its kit run's summary.json
    took when the run ended (`trnf train --train-py` writes it to <run>/out/, the summary to
    <run>/): what it was checked against, or None when no summary there names this file."""
    for run_dir in (checkpoint.parent.parent, checkpoint.parent):
        summary = _read_json(run_dir / SUMMARY_FILE)
        recorded, wrote = (summary or {}).get("checkpoint_sha256"), (summary or {}).get("final_checkpoint")
        if isinstance(recorded, str) and isinstance(wrote, str) and Path(wrote).resolve() == checkpoint.resolve():
            check_recorded_sha256(checkpoint, recorded, run_dir / SUMMARY_FILE)
            return f"SHA256 checked against {run_dir / SUMMARY_FILE} (the kit run's record)"
    return None


def _repair(damaged: Path) -> str:
    """What brings a damaged checkpoint file back: the run's own intact copy where the
    generated train.py published one (out/final.pt from out/run/final/), else a copy."""
    original = damaged.parent / "run" / FINAL_DIR / damaged.name
    try:
        if original.is_file() and check_file(original):
            return f"refusing to score it: copy {original} over it (the run's own copy, intact)"
    except DamagedFileError:
        pass
    return "refusing to score it: restore the file from a copy, or train the run again"


def worker_command(spec: WorkerSpec) -> list[str]:
    """Plain python for one process; torchrun for ``--nproc N`` (ranks share the work)."""
    entry = ["-m", "trnfrontier.evaluate.worker", spec.to_json()]
    if spec.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(spec.nproc), *entry]
    return [sys.executable, *entry]


def run_worker(spec: WorkerSpec, bar: Steps | None = None) -> dict[str, Any]:
    """Score one target in a fresh interpreter; a kill at the deadline is reported, not raised.
    With CORE there is no deadline (it reports progress instead; the report projects its time)."""
    deadline = None if spec.core else spec.timeout + LOAD_GRACE_SECONDS
    with tempfile.TemporaryDirectory(prefix="trnf-eval-") as scratch:
        progress_file = Path(scratch) / "progress.jsonl"
        spec = dataclasses.replace(spec, progress_file=str(progress_file))
        poll = relay(progress_file, bar) if bar is not None else None
        # The environment carries TRNF_PREPARE / TRNF_HOME / TRNF_DATASET as `trnf` set them;
        # CORE on the host allocates and frees batch-sized tensors for every forward, so glibc
        # keeps them in its heap (host_memory), as a CPU training process does.
        env = child_env(os.environ)
        if spec.core:
            env.update(host_memory.keep_freed_env(spec.device))
        done = processes.run_tree(worker_command(spec), timeout=deadline, env=env, poll=poll)
    if done.timed_out:
        return {
            "error": f"did not finish within {deadline or 0:g} s (--timeout {spec.timeout:g} s + {LOAD_GRACE_SECONDS:g} s to load); killed",
            "error_kind": "timeout",
        }
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        tail = [line for line in done.stderr.splitlines() if line.strip()]
        last = tail[-1] if tail else "no output"
        return {"error": f"the evaluation process died (exit {done.returncode}): {last}", "error_kind": "crash"}
    return result


def verdict(result: dict[str, Any]) -> tuple[str, list[str]]:
    """``ok``, ``invalid`` or ``error``, with the reasons a score may not be trusted."""
    if "error" in result:
        return "error", [result["error"]]
    reasons = []
    causality = result.get("causality") or {}
    if not causality.get("passed"):
        reasons.append(f"causality check failed (logits changed by {causality.get('max_abs_diff', float('nan')):.3g} when future tokens changed)")
    batch = result.get("batch_independence") or {}
    if not batch.get("passed"):
        reasons.append(
            f"batch-independence check failed (a row's logits changed by {batch.get('max_abs_diff', float('nan')):.3g} "
            f"with batch size, neighbours or a repeated call; tolerance {batch.get('tolerance', float('nan')):.3g})"
        )
    if result.get("eval_over_timeout"):
        reasons.append(f"evaluation exceeded the {result.get('timeout', 0):g} s timeout; the score covers only part of the tokens")
    value = result.get("val_bpb")
    if value is None or not math.isfinite(value):
        reasons.append("val_bpb is not a finite number")
    return ("invalid" if reasons else "ok"), reasons


def rank(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Valid scores first by val_bpb, then invalid ones, then failures; delta to the best valid one."""
    order = {"ok": 0, "invalid": 1, "error": 2}

    def key(r: dict[str, Any]) -> tuple[int, float]:
        value = r.get("val_bpb")
        return order[r["status"]], value if isinstance(value, (int, float)) and math.isfinite(value) else math.inf

    ranked = sorted(results, key=key)
    best = next((r["val_bpb"] for r in ranked if r["status"] == "ok"), None)
    for r in ranked:
        value = r.get("val_bpb")
        r["delta_to_best"] = value - best if best is not None and isinstance(value, (int, float)) else None
    return ranked


def evaluate(targets: list[Target], options: EvalOptions, progress: Steps | None = None) -> dict[str, Any]:
    """Score every target in its own process; the JSON document `trnf eval --json` prints.
    ``progress`` is told which target is being scored and advances as each finishes."""
    bar = progress or Steps.none()
    if not targets:
        raise UsageError("give at least one PATH (run dir, checkpoint dir or file) or --train-py with --checkpoint")
    check_device(options.device)
    if options.tokens is not None:
        parse_tokens(options.tokens, None)  # its form, before a path or the prepare.py is read
    check_paths(targets)
    contract = load_contract()
    prepare = contract.module
    # Only contract names are required; extras such as EVAL_SEQ_LEN fall back to the
    # contract's defaults (prepare_calls.CONTRACT_DEFAULTS).
    missing = missing_names(prepare, ("evaluate_bpb", "causality_check", "ensure_tokenizer"))
    if missing:
        raise TrnfError(f"{contract.path} has no {', '.join(missing)}; it is not a trusted prepare.py this tool can score with")
    results = []
    for target in targets:
        spec = worker_spec(target, options, prepare)
        started = bar.done
        core = f", then CORE on {options.core.items:,} items" if options.core else ""
        bar.describe(f"evaluating {target.label}: {spec.tokens:,} tokens, seq_len {spec.seq_len}, batch {spec.batch_size}{core} ...")
        result = {
            key: getattr(spec, key)
            for key in ("tokens_source", "seq_len", "seq_len_source", "batch_size", "timeout", "recorded_val_bpb")
        }
        result.update({"path": target.label, "checkpoint": str(target.path), "tokens_requested": spec.tokens})
        checked = check_target(target)
        result.update(checked if "error" in checked else {**checked, **run_worker(spec, bar)})
        result["status"], result["reasons"] = verdict(result)
        if result["status"] == "ok" and result["recorded_val_bpb"] is not None:
            result["matches_recorded"] = result["val_bpb"] == result["recorded_val_bpb"]
        results.append(result)
        # One unit per target, and one per CORE item (the worker relayed its share).
        bar.advance(max(0.0, 1 + (options.core.items if options.core else 0) - (bar.done - started)))
    ranked = rank(results)
    return {
        "split": "public_val",
        "prepare_path": str(contract.path),
        "prepare_sha256": contract.sha256,
        "results": ranked,
        "best": next((r["path"] for r in ranked if r["status"] == "ok"), None),
        "all_valid": all(r["status"] == "ok" for r in ranked),
    }
