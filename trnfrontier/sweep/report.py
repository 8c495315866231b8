"""What a sweep found, read from its trials' run directories (never from what a trial
process said about itself): one row per trial, sorted by the metric, the parameters that
differ, the best trial's resolved recipe, and metric against each swept parameter.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import yaml

from trnfrontier.runtime.recipe import SEED_KEY
from trnfrontier.runtime.rundir import RECIPE_FILE, read_summary
from trnfrontier.sweep import state as st
from trnfrontier.sweep.spec import SweepSpec
from trnfrontier.sweep.trial import failure_of, log_of, metric_value

BEST_RECIPE_FILE = "best_recipe.yaml"
FIGURE_FILE = "sweep.png"
# Trials whose step counts differ from the best's by more than this are not compared as
# equals (a slower trial "losing" at equal budget says little against its idea).
CONFOUNDED_STEPS = 0.10


def rows(sweep: st.SweepState, spec: SweepSpec, driver_alive: bool = True) -> list[dict[str, Any]]:
    """One row per trial: its parameters, status, metric, steps and error, best first."""
    found: list[dict[str, Any]] = []
    for trial_id, trial in sweep.trials.items():
        run_dir = sweep.folder / str(trial.get("run_dir") or f"{spec.name}-{trial_id}")
        summary = read_summary(run_dir) or {}
        status = trial.get("status") or "pending"
        if summary.get("status") == "completed" and status != st.FAILED:
            status = st.COMPLETED
        elif status == st.RUNNING and not driver_alive:
            status = "interrupted"
        value = metric_value(run_dir, spec.metric) if status == st.COMPLETED else None
        error = trial.get("error")
        if status == st.FAILED and not error:
            error = failure_of(run_dir, log_of(sweep.folder, run_dir))
        found.append({
            "trial": trial_id, "run_dir": str(run_dir), "params": trial.get("params") or {}, "status": status,
            spec.metric: value, "steps": summary.get("steps"), "fraction": trial.get("fraction"),
            "train_loss": trial.get("train_loss"), "error": error,
        })  # fmt: skip
    sign = 1.0 if spec.direction == "min" else -1.0
    found.sort(key=lambda r: (r[spec.metric] is None, sign * float(r[spec.metric] or 0.0)))
    _flag_confounded(found, spec.metric)
    return found


def _flag_confounded(found: list[dict[str, Any]], metric: str) -> None:
    best = next((r for r in found if r[metric] is not None and r["steps"]), None)
    for row in found:
        steps = row["steps"]
        row["confounded"] = bool(
            best is not None and row is not best and row[metric] is not None and steps
            and abs(steps - best["steps"]) / max(steps, best["steps"]) > CONFOUNDED_STEPS
        )


def best_trial(sweep: st.SweepState, spec: SweepSpec) -> tuple[str, float] | None:
    """(trial, metric) of the best completed trial so far, or None."""
    for row in rows(sweep, spec):
        if row[spec.metric] is not None and math.isfinite(row[spec.metric]):
            return row["trial"], float(row[spec.metric])
    return None


def progress_line(sweep: st.SweepState, spec: SweepSpec, alive: bool = True, now: float | None = None) -> str:
    """Trials running / done / stopped / failed / pending, the best so far and the time
    left (the live view's line, and `trnf sweep status`'s). The time left is this
    driver's pace: the trials that ended since it started, over the time since."""
    counts = sweep.counts()
    running = counts[st.RUNNING] if alive else 0  # a dead driver's trials wait for --resume
    total = max(spec.expected_trials(), len(sweep.trials))
    ended = counts[st.COMPLETED] + counts[st.STOPPED] + counts[st.FAILED]
    pending = max(0, total - ended - running)
    best = best_trial(sweep, spec)
    best_text = f"; best {spec.metric} {best[1]:.4f} ({best[0]})" if best else ""
    tail = ""
    if ended < total and not alive:
        tail = f"; no driver is running: continue with `trnf sweep --resume {sweep.folder}`"
    elif ended < total and sweep.driver_started is not None:
        since = sweep.driver_started
        here = [t for t in sweep.trials.values() if t.get("status") in st.ENDED and float(t.get("finished") or 0) >= since]
        if here:
            per = ((time.time() if now is None else now) - since) / len(here)
            tail = f"; about {per * (total - ended) / 60:.1f} min left"
    return (f"trials: {running} running, {counts[st.COMPLETED]} done, {counts[st.STOPPED]} stopped, "
            f"{counts[st.FAILED]} failed, {pending} pending{best_text}{tail}")  # fmt: skip


def varying(found: list[dict[str, Any]]) -> list[str]:
    """The parameter keys whose values differ between trials (the table's columns)."""
    keys: list[str] = []
    for row in found:
        keys += [k for k in row["params"] if k not in keys]
    return [k for k in keys if len({repr(r["params"].get(k)) for r in found}) > 1]


def write_best_recipe(sweep: st.SweepState, found: list[dict[str, Any]], metric: str) -> Path | None:
    """The best completed trial's resolved recipe, as YAML `trnf train` takes."""
    best = next((r for r in found if r[metric] is not None), None)
    if best is None:
        return None
    source = Path(best["run_dir"]) / RECIPE_FILE
    try:
        recipe = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None  # a kit trial has no recipe: its flags are in the table
    path = sweep.folder / BEST_RECIPE_FILE
    header = f"# The best trial of sweep {sweep.sweep_id}: {best['trial']} ({metric} {best[metric]:.6f}).\n"
    path.write_text(header + yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return path


def write_figure(sweep: st.SweepState, spec: SweepSpec, found: list[dict[str, Any]]) -> Path | None:
    """Metric against each swept parameter, one panel each (completed trials)."""
    keys = [k for k in varying(found) if any(r[spec.metric] is not None for r in found)]
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        points = [(r["params"].get(key), r[spec.metric]) for r in found if r[spec.metric] is not None]
        # Seeds are names, not quantities: one column each.
        numeric = key != SEED_KEY and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x, _ in points)
        if not numeric:
            points.sort(key=lambda point: str(point[0]))
        xs = [x if numeric else str(x) for x, _ in points]
        ax.scatter(xs, [y for _, y in points], color="tab:blue")
        dim = spec.space.get(key)
        if dim is not None and dim.kind == "loguniform":
            ax.set_xscale("log")
        ax.set_xlabel(key)
        ax.set_ylabel(f"{spec.metric} ({'lower' if spec.direction == 'min' else 'higher'} is better)")
        ax.grid(alpha=0.3)
    fig.suptitle(f"sweep {sweep.name}: {spec.metric} of each completed trial")
    fig.tight_layout()
    path = sweep.folder / FIGURE_FILE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
