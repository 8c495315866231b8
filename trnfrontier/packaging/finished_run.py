"""A finished run directory as `trnf package` sees it, and the reasons to refuse packaging it.

The layout is docs/architecture.md's: ``summary.json``, ``metrics.jsonl``,
``step_boundaries.jsonl``, ``final/`` (``model.safetensors``, ``meta.json``, ``final.pt``)
and the resolved recipe in ``recipe.json`` (else the copy the trainer stores in
``final/meta.json``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnfrontier.contract.budget import account_log, recorded_start
from trnfrontier.contract.checkpoint import CheckpointError, scan_safetensors
from trnfrontier.contract.phases import DEFAULT_PHASE, PHASES, Phase
from trnfrontier.contract.pins import Pins
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.runtime.budget_rule import BUDGET_SECONDS
from trnfrontier.runtime.integrity import DamagedFileError, check_directory
from trnfrontier.runtime.rundir import (
    COMPLETED,
    FINAL_DIR,
    KIT_FILE,
    META_FILE,
    METRICS_FILE,
    MODEL_FILE,
    RECIPE_FILE,
    STEP_LOG_FILE,
    SUMMARY_FILE,
)
from trnfrontier.runtime.runlock import live_writer


@dataclass(frozen=True)
class RunDir:
    path: Path
    summary: dict[str, Any]
    recipe: dict[str, Any]
    final_dir: Path  # holds model.safetensors, meta.json, final.pt

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def step_log(self) -> Path:
        return self.path / STEP_LOG_FILE


def read_json(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path``, or a one-line TrnfError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TrnfError(f"{path}: no {what} here") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrnfError(f"{path}: {what} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TrnfError(f"{path}: {what} must be a JSON object")
    return data


def recorded_phase(run_dir: Path | None) -> int | None:
    """The phase a run directory recorded: a kit run's summary.json ``phase``, else its
    recipe.json's (a recipe run, or the run a trnf init train.py wrote; Phase 1 is not
    written there). None when it records neither (a kit run from before trnf recorded
    phases) or cannot be read: the caller's default applies."""
    if run_dir is None:
        return None
    for name, absent in ((SUMMARY_FILE, None), (RECIPE_FILE, DEFAULT_PHASE)):
        try:
            document = json.loads((Path(run_dir) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        number = document.get("phase", absent) if isinstance(document, dict) else None
        if type(number) is int and number in PHASES:
            return number
    return None


def read_run(path: Path) -> RunDir:
    """Read a run directory; anything that makes it unpackageable even with --force is an error here."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(
            f"{path}: no such run directory (give runs/<name>, the --out of `trnf train`)"
        )
    writer = live_writer(path)
    if writer is not None:
        raise TrnfError(
            f"{path} is still being trained, written by {writer.description}; package it once that run has "
            f"finished (or stop it: {writer.how_to_stop(path)})"
        )
    summary = read_json(path / SUMMARY_FILE, "summary.json (is this a finished `trnf train` run?)")
    final_dir = path / FINAL_DIR
    missing = [
        name
        for name in (MODEL_FILE, META_FILE, KIT_FILE)
        if not (final_dir / name).is_file()
    ]
    if missing:
        status = summary.get("status", "unknown")
        raise TrnfError(
            f"{path} has no final checkpoint (final/{', final/'.join(missing)} missing; run status {status}); "
            "only a run that completed can be packaged"
        )
    try:
        check_directory(final_dir)  # a flipped byte would otherwise be packaged and scored
    except DamagedFileError as exc:
        raise TrnfError(
            f"{exc}; refusing to package it: restore final/ from a copy or train the run again"
        ) from None
    if (path / RECIPE_FILE).is_file():
        recipe = read_json(path / RECIPE_FILE, "recipe.json")
    else:
        recorded = read_json(final_dir / META_FILE, "final/meta.json").get("recipe")
        if not isinstance(recorded, dict):
            raise TrnfError(
                f"{path}: no recipe.json and final/meta.json records no recipe; cannot regenerate train.py"
            )
        recipe = recorded
    if not (path / STEP_LOG_FILE).is_file():
        raise TrnfError(
            f"{path / STEP_LOG_FILE} is missing: the budget cannot be checked without the step-boundary log"
        )
    return RunDir(path=path, summary=summary, recipe=recipe, final_dir=final_dir)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def checkpoint_params(safetensors: Path) -> tuple[int, list[str]]:
    """(parameter count, names of tensors holding NaN/inf) of a model.safetensors."""
    try:
        scan = scan_safetensors(safetensors)
    except (CheckpointError, OSError) as exc:
        raise TrnfError(f"{safetensors}: unreadable checkpoint ({exc})") from None
    return scan.params, list(scan.non_finite)


def pin_problems(prepare_sha256: Any, tokenizer_sha256: Any, pins: Pins) -> list[str]:
    """Reasons the run's prepare.py / tokenizer are not the pinned ones (empty: they are)."""
    reasons = []
    for what, used, pin in (
        ("prepare.py", prepare_sha256, pins.prepare),
        ("tokenizer", tokenizer_sha256, pins.tokenizer),
    ):
        if pin.sha256 is None:
            continue
        if not pin.matches(used):
            reasons.append(
                f"{what} SHA256 {str(used)[:16]}... is not the pinned {pin.sha256[:16]}... ({pin.source})"
            )
    return reasons


def log_budget_reason(
    step_log: Path, phase: Phase = PHASES[DEFAULT_PHASE], summary: dict[str, Any] | None = None
) -> str | None:
    """Why the step-boundary log fails the organisers' accounting (as verify computes it,
    against ``phase``'s budget), or None. A log without a header line starts where the run's
    ``summary`` recorded (a kit run: trnf's launch)."""
    from trnfrontier.trusted_prepare import load_contract

    try:
        prepare = load_contract().module
    except TrnfError:
        prepare = None  # verify's documented formula then
    launch, source = recorded_start(summary)
    accounting, how = account_log(step_log, prepare, phase, launch, source)
    if accounting is None:
        return how
    if accounting["over_budget"]:
        return f"over budget by {how}: charged {float(accounting['charged_seconds']):.1f} s"
    if accounting.get("lower_bound"):
        return f"the step log gives each step's duration only ({accounting['step_log']}): it cannot show the run kept to the budget"
    return None


def refusal_reasons(
    summary: dict[str, Any],
    pins: Pins,
    non_finite: list[str],
    *,
    unmeasured: str,
    step_log: Path | None = None,
    phase: Phase = PHASES[DEFAULT_PHASE],
) -> list[str]:
    """Why a run should not be submitted (each can be overridden with --force).

    ``summary`` is a run's summary.json (a kit run's may lack keys: absent means unknown,
    not bad, except val_bpb, whose absence ``unmeasured`` explains how to fix). The
    step-boundary log, when given, is accounted as verify will account it.
    """
    s = summary
    reasons = []
    if s.get("over_budget"):
        reasons.append(
            f"over budget: charged {float(s.get('charged_seconds') or 0):.1f} s of {float(s.get('budget_seconds') or BUDGET_SECONDS):g}"
        )
    elif step_log is not None and (reason := log_budget_reason(step_log, phase, s)):
        reasons.append(reason)
    if s.get("status") not in (None, COMPLETED):
        step = f" at step {s['diverged_step']}" if s.get("diverged_step") else ""
        reasons.append(f"run status is {s.get('status')!r}{step}, not 'completed'")
    if s.get("final_loss") is not None and not _finite(s.get("final_loss")):
        reasons.append(f"final loss is {s.get('final_loss')}")
    if non_finite:
        reasons.append(f"NaN/inf in the final checkpoint ({', '.join(non_finite[:3])})")
    if s.get("val_bpb") is None:
        reasons.append(f"no measured val_bpb ({unmeasured})")
    elif not _finite(s.get("val_bpb")):
        reasons.append(f"val_bpb is {s.get('val_bpb')}")
    reasons += pin_problems(s.get("prepare_sha256"), s.get("tokenizer_sha256"), pins)
    return reasons
