"""The run directory: its file names, the summary a run leaves, its statuses and exit codes.

This is to a run directory what ``trnfrontier/submission.py`` is to the archive: the one
place that says what a run directory holds. The trainer writes it; ``trnf train`` (the
parent process), ``trnf eval``, ``trnf package``, kit runs, ``trnf verify``'s dry run
and the generated train.py read it, all through these names. Runtime layer: standard
library only, since a submission carries it (and a single-file train.py inlines it).

Layout (docs/architecture.md has the table of every summary key)::

    recipe.json                   the resolved recipe (RECIPE_FILE)
    metrics.jsonl                 one JSON object per logged step (METRICS_FILE)
    step_boundaries.jsonl         what record_step_boundary wrote (STEP_LOG_FILE)
    summary.json                  RunSummary (SUMMARY_FILE)
    train.log                     the worker's console output (LOG_FILE)
    writer.lock                   pids and host of the live writer (LOCK_FILE), while it runs
    checkpoints/step_XXXXXX/      resumable: model.safetensors, meta.json, optim.pt,
                                  rng.safetensors, state.json, manifest.json
    final/                        consolidated: model.safetensors, meta.json, final.pt,
                                  manifest.json
    provenance.json               the tool's: recipe as given, overrides, git, env, data (PROVENANCE_FILE)
    scores.jsonl                  the tool's: one line per `trnf eval` score (SCORES_FILE)
    official.jsonl                the tool's: leaderboard scores recorded for it (OFFICIAL_FILE)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, TypedDict

from trnfrontier.runtime.atomic import atomic_write_json

RECIPE_FILE = "recipe.json"
METRICS_FILE = "metrics.jsonl"
STEP_LOG_FILE = "step_boundaries.jsonl"
SUMMARY_FILE = "summary.json"
LOG_FILE = "train.log"
LOCK_FILE = "writer.lock"  # who writes this run directory now (runtime/runlock.py)
CHECKPOINTS_DIR = "checkpoints"
# Written by the tool, not the trainer (trnfrontier.ledger): the run ledger indexes them.
PROVENANCE_FILE = "provenance.json"
SCORES_FILE = "scores.jsonl"
OFFICIAL_FILE = "official.jsonl"
FINAL_DIR = "final"
# Inside a checkpoint directory (step_XXXXXX/ or final/).
MODEL_FILE = "model.safetensors"
META_FILE = "meta.json"
OPTIM_FILE = "optim.pt"
STATE_FILE = "state.json"
RNG_FILE = "rng.safetensors"
KIT_FILE = "final.pt"  # the organisers' checkpoint layout (model_state, model_config, meta)
MANIFEST_FILE = "manifest.json"  # size and SHA256 of each file above (runtime/integrity.py)

# A kit-style train.py (and a generated one) writes out/final.pt relative to its own directory.
KIT_OUT_DIR = "out"

# The trainer prints a line starting with one of these when a long phase with no new metrics
# begins (the first step's compile, the final evaluation) or ends (the first step); `trnf
# train` watches train.log for them to show the phase and its elapsed time.
COMPILE_MARK = "compiling:"
FIRST_STEP_MARK = "first step "
FINAL_EVAL_MARK = "final evaluation:"

# Where record_step_boundary appends (prepare.py reads the same variable).
STEP_LOG_ENV = "TRNF_STEP_LOG"

RunStatus = Literal["completed", "diverged", "crashed", "interrupted", "timed_out"]
COMPLETED: RunStatus = "completed"
DIVERGED: RunStatus = "diverged"
CRASHED: RunStatus = "crashed"
INTERRUPTED: RunStatus = "interrupted"  # Ctrl-C / SIGTERM: recipe runs checkpoint their last step (runtime/interrupt.py)
TIMED_OUT: RunStatus = "timed_out"  # kit runs: still running at --timeout, killed

# The exit status of whatever ran the training (the runtime entry point, a generated
# train.py, `trnf train --train-py`): 0 completed, 3 diverged, 130 interrupted, 1 otherwise
# (crashed, timed out, or no summary at all).
EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_DIVERGED = 3
EXIT_INTERRUPTED = 130


def exit_code_for(status: str | None) -> int:
    """The process exit status for a run that ended with ``status``."""
    if status == COMPLETED:
        return EXIT_COMPLETED
    if status == DIVERGED:
        return EXIT_DIVERGED
    if status == INTERRUPTED:
        return EXIT_INTERRUPTED
    return EXIT_FAILED


class RunSummary(TypedDict, total=False):
    """summary.json. A completed or diverged recipe run has every key below except
    ``error``, ``run_dir`` and ``exit_code``; a crashed run only ``name``, ``status``, ``error``, ``val_bpb``,
    ``last_good_checkpoint`` (+ ``versions`` when the trainer wrote it, ``expected_fault`` for a fault); kit runs add keys
    of their own. The parent process adds ``run_dir`` and ``exit_code`` to what it returns."""

    name: str | None
    status: RunStatus
    error: str
    stop_reason: str
    val_bpb: float | None
    eval_tokens: int
    eval_seq_len: int
    eval_batch_size: int
    eval_num_tokens: int | None
    eval_num_bytes: int | None
    eval_seconds: float | None
    params: int
    tokens: int
    steps: int
    tokens_per_second: float | None
    mfu: float | None
    final_loss: float | None
    charged_seconds: float
    startup_seconds: float
    compiled: bool  # runtime.compile as decided for this device
    host_memory_kept: bool  # CPU: glibc keeps freed blocks for reuse (runtime/host_memory.py)
    polar_dtype: str  # what Muon's Polar Express computes in on this device (runtime/muon.py)
    first_step_seconds: float | None  # this process's first step (includes any compile)
    headroom_seconds: float
    over_budget: bool
    budget_seconds: float
    device: str
    kernels: dict[str, Any]
    dtype: str
    world_size: int
    versions: dict[str, str | None]
    speed_env: dict[str, Any]  # what changes speed besides the recipe (runtime/speed_env.py)
    prepare_sha256: str
    tokenizer_sha256: str
    final_checkpoint: str | None
    diverged_step: int | None
    last_good_checkpoint: str | None
    # A crash the user can act on (disk full, read-only folder, damaged checkpoint, ...):
    # ``error`` is its one line; the traceback is only in train.log (runtime/faults.py).
    expected_fault: bool
    resumed_from: str | None
    run_dir: str
    exit_code: int


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl file of a run (metrics, scores): a missing or unreadable
    file gives none; a torn line (a write cut short by a kill) or a non-object is skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    records: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's summary.json as a dict, or None when it is missing or unreadable."""
    try:
        data = json.loads((Path(run_dir) / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_crash_summary(
    run_dir: str | os.PathLike[str],
    *,
    name: str | None,
    error: str,
    last_good_checkpoint: str | os.PathLike[str] | None,
    versions: dict[str, str | None] | None = None,
    status: RunStatus = CRASHED,
    expected_fault: bool = False,
) -> dict[str, Any]:
    """Write (atomically) and return the summary of a run that crashed: what went wrong and
    what can be resumed. The trainer writes it for an exception it saw; ``trnf train``
    writes it for a worker that died without writing one."""
    summary: dict[str, Any] = {
        "name": name,
        "status": status,
        "error": error,
        "val_bpb": None,
        "last_good_checkpoint": str(last_good_checkpoint or "") or None,
    }
    if versions is not None:
        summary["versions"] = versions
    if expected_fault:
        summary["expected_fault"] = True
    atomic_write_json(Path(run_dir) / SUMMARY_FILE, summary)
    return summary
