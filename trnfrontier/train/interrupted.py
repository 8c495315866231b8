"""A run that stopped early (Ctrl-C, a crash): how it continues, in the words `trnf` prints.

Two cases, and the message must name the one that works:
- a complete checkpoint exists: ``trnf train --resume RUN_DIR`` continues from it;
- none yet (stopped during startup, before ``run.checkpoint_every_seconds``): there is
  nothing to resume, so the same command is suggested again, and ``trnf train`` accepts
  that run directory for a fresh start (``restartable``), clearing what the stopped run
  left (``clear_stopped_run``) so no old metrics or step log mix into the new run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trnfrontier.hints import trnf_line
from trnfrontier.runtime.checkpoint_ref import latest_checkpoint
from trnfrontier.runtime.rundir import (
    CHECKPOINTS_DIR,
    CRASHED,
    INTERRUPTED,
    LOCK_FILE,
    LOG_FILE,
    META_FILE,
    METRICS_FILE,
    PROVENANCE_FILE,
    RECIPE_FILE,
    STEP_LOG_FILE,
    SUMMARY_FILE,
    read_jsonl,
    read_summary,
)

# What a recipe run writes before its first complete checkpoint.
_EARLY_FILES = frozenset({RECIPE_FILE, METRICS_FILE, STEP_LOG_FILE, SUMMARY_FILE, LOG_FILE, CHECKPOINTS_DIR})
# ... and what `trnf train` writes beside them (the ledger's provenance): allowed in a
# restartable folder, but not cleared, since the new start has already rewritten it.
_TOOL_FILES = frozenset({PROVENANCE_FILE})


def checkpoint_meta(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's meta.json (step, charged seconds, ...); empty when unreadable."""
    try:
        data = json.loads((checkpoint / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resume_note(run_dir: Path) -> str | None:
    """``resuming RUN_DIR from checkpoints/step_000040 (step 40, 312 s of the budget charged)``."""
    latest = latest_checkpoint(run_dir)
    if latest is None:
        return None
    meta = checkpoint_meta(latest)
    parts = [f"step {meta['step']}"] if "step" in meta else []
    if isinstance(meta.get("charged_seconds"), (int, float)):
        parts.append(f"{meta['charged_seconds']:.0f} s of the budget charged")
    detail = f" ({', '.join(parts)})" if parts else ""
    return f"resuming {run_dir} from {latest.relative_to(run_dir)}{detail}"


def steps_done(run_dir: Path) -> int | None:
    """How many steps the run completed, from its step-boundary log (the last 0-based
    index + 1; a resumed run's log goes on from its checkpoint), None when it has none."""
    steps = [r["step"] for r in read_jsonl(run_dir / STEP_LOG_FILE) if type(r.get("step")) is int]
    return steps[-1] + 1 if steps else None


def stop_message(run_dir: Path, rerun: str) -> str:
    """What to type after an interrupted run, and what it costs: ``--resume`` when a
    checkpoint exists (with how many steps it repeats: those done since that checkpoint),
    else ``rerun`` (the command that started it), which restarts it in the same folder."""
    latest = latest_checkpoint(run_dir)
    done = steps_done(run_dir)
    resume = f"`{trnf_line('train', '--resume', str(run_dir))}`"
    if latest is not None:
        step = checkpoint_meta(latest).get("step")
        where = f"{latest.relative_to(run_dir)} (step {step if step is not None else '?'})"
        if isinstance(step, int) and done is not None and done > step:
            repeated = done - step
            return (
                f"training stopped at step {done}; the newest checkpoint is {where}, so {resume} "
                f"repeats {repeated} step{'s' if repeated != 1 else ''}"
            )
        if isinstance(step, int) and done == step:
            return f"training stopped at step {done}; its checkpoint {where} holds every step done: continue with {resume}"
        return f"training stopped; continue it from {where} with {resume}"
    lost = f" ({done} step{'s' if done != 1 else ''} done are lost)" if done else ""
    return (
        f"training stopped before its first checkpoint, so there is nothing to resume{lost}; "
        f"start it again with `{rerun}`"
    )


def restartable(run_dir: Path) -> bool:
    """True when ``run_dir`` holds only a run that stopped (crashed or interrupted, its
    summary says so) before its first complete checkpoint: a fresh start may replace it.
    A live run has no summary yet, so it is never replaced."""
    if not run_dir.is_dir():
        return False
    # A lock left by a killed writer is stale; the new writer's lock replaces it.
    names = {child.name for child in run_dir.iterdir()} - {LOCK_FILE}
    if RECIPE_FILE not in names or not names <= _EARLY_FILES | _TOOL_FILES:
        return False
    if latest_checkpoint(run_dir) is not None:
        return False
    summary = read_summary(run_dir)
    return summary is not None and summary.get("status") in (CRASHED, INTERRUPTED)


def clear_stopped_run(run_dir: Path) -> None:
    """Remove what a stopped run left (``restartable`` checked that it is nothing else)."""
    for name in _EARLY_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
