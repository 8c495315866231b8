"""One trial, as it runs inside a Ray worker: an ordinary ``trnf train`` in a process of
its own, into its own run directory under the sweep's folder.

Nothing here trusts the training process's word. What the trial reports to Ray Tune is
read from its run directory: the training loss from ``metrics.jsonl`` as the run writes
it (at fixed fractions of the run's budget, for ASHA), the metric from ``summary.json``
(or, for a kit script, the trusted score ``trnf eval`` appended to ``scores.jsonl``, over
the tokens ``NEURON_COMPETITION_R1_EVAL_TOKENS`` gave the run, else the public 2,097,152).

A trial is idempotent on its run directory, which is what makes ``trnf sweep --resume``
honest: a completed run is reported again without training (scored first if it was not
yet), an interrupted one continues with ``trnf train --resume`` from its latest
checkpoint, one that stopped before any checkpoint starts again. A kit script owns its
checkpoints, so an interrupted kit trial starts again from scratch.

Each kit trial's checkpoint lands in its own run directory (``<run dir>/out``, through
the kit's ``NEURON_COMPETITION_R1_OUT_DIR``: ``kit/out_dir.py``), so kit trials run at
once as recipe trials do; a script that ignores that variable fails its trials when
they run at once (``shared_checkpoint``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnfrontier import processes
from trnfrontier.contract.kit import EVAL_TOKENS_ENV, OUT_DIR_ENV
from trnfrontier.ledger.provenance import SWEEP_ENV, append_line, read_json
from trnfrontier.runtime import runlock
from trnfrontier.runtime.atomic import atomic_write_bytes
from trnfrontier.runtime.checkpoint_ref import latest_checkpoint
from trnfrontier.runtime.rundir import (
    COMPLETED,
    INTERRUPTED,
    METRICS_FILE,
    RECIPE_FILE,
    SCORES_FILE,
    SUMMARY_FILE,
    read_jsonl,
    read_summary,
    write_crash_summary,
)
from trnfrontier.sweep.space import params_of, train_words
from trnfrontier.sweep.spec import SweepSpec

POLL_SECONDS = 0.5
# How long the driver waits for a stopped trial's processes to be gone before it writes
# the run's summary (Ray ends them with the trial's worker).
SETTLE_SECONDS = 30.0
LOGS_DIR = "logs"  # under the sweep folder: each trial's `trnf train` console output
# Beside a trial's log: the line its trial raised with, for the driver (the run directory
# may hold a completed summary that says nothing of why the trial failed).
ERROR_SUFFIX = ".error"


class TrialFailed(RuntimeError):
    """The trial's run did not complete; the message is its error line (from the run)."""


@dataclass(frozen=True)
class Job:
    """What every trial needs to know about its sweep (pickled to the Ray workers)."""

    sweep_id: str
    sweep_dir: str
    spec: SweepSpec
    cwd: str
    env: dict[str, str] = field(default_factory=dict)

    def run_dir(self, trial_id: str) -> Path:
        return Path(self.sweep_dir) / f"{self.spec.name}-{trial_id}"

    def log(self, trial_id: str) -> Path:
        return log_of(Path(self.sweep_dir), self.run_dir(trial_id))


def log_of(sweep_dir: Path, run_dir: Path) -> Path:
    """A trial's console log, under its sweep's folder (its error file beside it)."""
    return sweep_dir / LOGS_DIR / f"{run_dir.name}.log"


def trnf_command(words: list[str]) -> list[str]:
    """``trnf ...`` with the Python this worker runs (the same installation everywhere)."""
    return [sys.executable, "-m", "trnfrontier", *words]


def progress(record: dict[str, Any], budget: dict[str, Any]) -> float:
    """How far through its budget a run is at a metrics record: steps against
    ``budget.max_steps`` or charged seconds against ``budget.seconds``, whichever is ahead."""
    done = 0.0
    max_steps = budget.get("max_steps")
    if max_steps:
        done = float(record.get("step") or 0) / float(max_steps)
    seconds = float(budget.get("seconds") or 0)
    if seconds > 0:
        done = max(done, float(record.get("charged_seconds") or 0.0) / seconds)
    return done


def mean_loss(records: list[dict[str, Any]]) -> float:
    """The training loss over a stretch of records (a NaN or missing loss is infinite: a
    diverging trial ranks last)."""
    losses = [r.get("loss") for r in records]
    finite = [float(x) for x in losses if isinstance(x, (int, float)) and math.isfinite(x)]
    if not losses or len(finite) < len(losses):
        return math.inf
    return sum(finite) / len(finite)


def metric_value(run_dir: Path, metric: str) -> float | None:
    """The trial's metric, from its run directory only: summary.json, else the latest
    trusted score in scores.jsonl (a kit run's `trnf eval`)."""
    summary = read_summary(run_dir) or {}
    value = summary.get(metric)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    scored = [s.get(metric) for s in read_jsonl(run_dir / SCORES_FILE)]
    found = [float(v) for v in scored if isinstance(v, (int, float)) and math.isfinite(v)]
    return found[-1] if found else None


def error_line(run_dir: Path, log: Path) -> str:
    """Why a trial's run did not complete: its summary's error, else trnf's last error line."""
    summary = read_summary(run_dir)
    if summary is not None:
        if summary.get("status") == "diverged":
            return f"diverged at step {summary.get('diverged_step')} (loss NaN/inf or above run.max_loss)"
        if summary.get("error"):
            return str(summary["error"])
        if summary.get("problems"):
            return str(summary["problems"][0])
    said = logged_error(log)
    if said is not None:
        return said
    if summary is None:
        return f"no summary.json in {run_dir} (see {log})"
    return f"{run_dir / SUMMARY_FILE} says {summary.get('status') or 'nothing'} and names no error (see {log})"


def logged_error(log: Path) -> str | None:
    """trnf's last error line in a trial's log, or None."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    said = [line for line in lines if line.startswith("trnf: error:")]
    return said[-1].removeprefix("trnf: error: ") if said else None


def failure_of(run_dir: Path, log: Path) -> str:
    """A failed trial's error line: the one the trial raised with (its error file), else
    what its run directory and log show."""
    try:
        recorded = log.with_suffix(ERROR_SUFFIX).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        recorded = ""
    return recorded or error_line(run_dir, log)


class Reporter:
    """Reads metrics.jsonl as the run writes it and reports the training loss to Tune at
    each 1/N of the budget; the last report (N/N) waits for the run's result."""

    def __init__(self, run_dir: Path, reports: int, report: Any) -> None:
        self.run_dir, self.reports, self.report = run_dir, reports, report
        self.seen = 0
        self.sent = 0  # reports sent so far
        self.window: list[dict[str, Any]] = []
        self.last_loss = math.inf
        self.budget: dict[str, Any] | None = None

    def poll(self) -> None:
        if self.budget is None:
            recipe = read_json(self.run_dir / RECIPE_FILE)
            if recipe is None:
                return
            self.budget = recipe.get("budget") or {}
        records = read_jsonl(self.run_dir / METRICS_FILE)
        for record in records[self.seen:]:
            self.window.append(record)
            done = progress(record, self.budget)
            while self.sent + 1 < self.reports and done >= (self.sent + 1) / self.reports:
                self.send()
        self.seen = len(records)

    def send(self, **extra: Any) -> None:
        if self.window:
            self.last_loss = mean_loss(self.window)
        self.sent += 1
        self.report({"train_loss": self.last_loss, "fraction": self.sent / self.reports, **extra})
        self.window = []

    def finish(self, **result: Any) -> None:
        """Reports up to the last one; the last carries the run's result."""
        self.poll()
        while self.sent + 1 < self.reports:
            self.send()
        self.send(**result)


def plan_words(job: Job, params: dict[str, Any], run_dir: Path) -> list[str] | None:
    """The `trnf train` words for this trial now: None when its run already completed,
    ``--resume`` from a checkpoint, else a fresh start (clearing a run that left nothing
    worth keeping: no checkpoint, so nothing is lost; or a kit run, whose script owns its
    checkpoints and cannot be resumed by trnf)."""
    summary = read_summary(run_dir) or {}
    if summary.get("status") == COMPLETED:
        return None
    if job.spec.recipe is not None and latest_checkpoint(run_dir) is not None:
        return ["train", "--resume", str(run_dir)]
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return ["train", *train_words(job.spec, params, str(run_dir))]


def run_trial(job: Job, config: dict[str, Any]) -> None:
    """The trainable (inside a Ray worker): one trial, start to end (or resumed)."""
    from ray import tune

    run_one_trial(job, tune.get_context().get_trial_id(), config, tune.report)


def run_one_trial(job: Job, trial_id: str, config: dict[str, Any], report: Any) -> None:
    """One trial, reporting what its run directory shows. Raises TrialFailed with the
    run's error line when it did not complete; the line the trial fails with (any
    exception's) is written beside its log first, for the driver (``failure_of``)."""
    log = job.log(trial_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    error_file = log.with_suffix(ERROR_SUFFIX)
    error_file.unlink(missing_ok=True)  # a line from an earlier attempt is not this one's
    try:
        _trial(job, trial_id, config, report, log)
    except Exception as exc:
        line = str(exc) if isinstance(exc, TrialFailed) else f"{type(exc).__name__}: {exc}"
        atomic_write_bytes(error_file, (line.splitlines() or [type(exc).__name__])[0].encode())
        raise


def _trial(job: Job, trial_id: str, config: dict[str, Any], report: Any, log: Path) -> None:
    params = params_of(job.spec, config)
    run_dir = job.run_dir(trial_id)
    reports = job.spec.early_stop.reports if job.spec.early_stop else 1
    reporter = Reporter(run_dir, reports, report)
    words = plan_words(job, params, run_dir)
    record = {"id": job.sweep_id, "trial": trial_id, "params": params}
    env = {**os.environ, **job.env, SWEEP_ENV: json.dumps(record, sort_keys=True)}
    if words is not None:
        _train(trnf_command(words), env, job.cwd, log, reporter)
    summary = read_summary(run_dir) or {}
    # A kit run may complete with problems (over budget, no checkpoint): `trnf train` failed it.
    if summary.get("status") != COMPLETED or summary.get("problems"):
        raise TrialFailed(error_line(run_dir, log))
    shared = shared_checkpoint(job.spec, summary)
    if shared is not None:
        raise TrialFailed(shared)
    if metric_value(run_dir, job.spec.metric) is None:
        # Measured after training, also for a run that completed before the sweep was
        # stopped but was not scored yet (`trnf sweep --resume`).
        _measure(job, run_dir, env, log)
    value = metric_value(run_dir, job.spec.metric)
    if value is None:  # trained, but the metric was not measured (a failed CORE evaluation, say)
        said = logged_error(log)
        raise TrialFailed(f"the run completed without a {job.spec.metric}" + (f": {said}" if said else f" (see {log})"))
    reporter.finish(**{job.spec.metric: value, "steps": summary.get("steps")})


def shared_checkpoint(spec: SweepSpec, summary: dict[str, Any]) -> str | None:
    """Why a completed kit trial's checkpoint cannot be trusted as its own, or None.

    Found after the run, from what the run recorded (kit/out_dir.py: the script wrote beside
    itself instead of into the folder NEURON_COMPETITION_R1_OUT_DIR named), rather than by
    reading the script before: a script takes that variable in ways no static check sees
    (the kit's own builds the name from a prefix), and a wrong guess would refuse a script
    that honours it. The cost is one round of trials before the sweep's table says why."""
    if spec.train_py is None or spec.concurrency == 1 or not summary.get("out_dir_ignored"):
        return None
    return (f"train.py ignores {OUT_DIR_ENV} and wrote {summary.get('final_checkpoint')} beside itself, where trials "
            f"running at once write, and take, each other's checkpoint; a sweep of this script needs concurrency: 1")


def _measure(job: Job, run_dir: Path, env: dict[str, str], log: Path) -> None:
    """The metric a completed run's summary lacks, into its scores.jsonl: a kit run's score
    (`trnf eval --train-py`), or CORE (`trnf eval --core`: not part of training)."""
    if job.spec.train_py is not None:
        _score_kit_run(job, run_dir, env, log)
    elif job.spec.metric == "core":
        _run_logged(trnf_command(["eval", str(run_dir), "--core", *job.spec.core_args]), job.cwd, env, log)


def _train(cmd: list[str], env: dict[str, str], cwd: str, log: Path, reporter: Reporter) -> None:
    """Run ``trnf train`` to its end, reporting as its metrics land (the run's summary, not its
    exit code, says how it ended). It dies with this worker (Ray stops a trial ASHA cut, or the
    whole sweep, by ending the worker)."""
    with open(log, "ab") as handle:
        handle.write(f"$ {' '.join(cmd)}\n".encode())
        handle.flush()
        proc = processes.start(cmd, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT, die_with_parent=True)
        try:
            while proc.poll() is None:
                reporter.poll()
                time.sleep(POLL_SECONDS)
        finally:
            if proc.poll() is None:
                processes.stop_tree(proc)


def _run_logged(cmd: list[str], cwd: str, env: dict[str, str], log: Path) -> str:
    """Run a `trnf` command to its end, its stderr into the trial's log; its stdout."""
    with open(log, "ab") as handle:
        handle.write(f"$ {' '.join(cmd)}\n".encode())
        handle.flush()
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=handle, check=False)
    return done.stdout.decode("utf-8", "replace")


def _score_kit_run(job: Job, run_dir: Path, env: dict[str, str], log: Path) -> None:
    """A kit run's summary has no trusted score: `trnf eval` scores its checkpoint with
    the trusted evaluate_bpb, and the number goes into the run's own scores.jsonl."""
    summary = read_summary(run_dir) or {}
    checkpoint = summary.get("final_checkpoint")
    if not checkpoint:
        return
    core = ["--core", *job.spec.core_args] if job.spec.metric == "core" else []
    # As many tokens as the run's own in-process eval was told to score (the kit's knob, as
    # `trnf package` reads it), else trnf eval's default: the public 2,097,152.
    tokens = (summary.get("kit_env") or {}).get(EVAL_TOKENS_ENV)
    size = ["--tokens", str(tokens)] if tokens else []
    cmd = trnf_command(["eval", "--train-py", str(job.spec.train_py), "--checkpoint", str(checkpoint), *size, *core, "--json"])
    try:
        results = json.loads(_run_logged(cmd, job.cwd, env, log)).get("results", [])
    except ValueError:
        return
    for result in results:
        if isinstance(result.get("val_bpb"), (int, float)) and result.get("status") != "error":
            line = {key: result.get(key) for key in ("val_bpb", "num_tokens", "num_bytes", "seq_len", "prepare_sha256", "tokenizer_sha256")}
            core_score = (result.get("core") or {}).get("core_metric")
            if isinstance(core_score, (int, float)):
                line["core"] = float(core_score)
            append_line(run_dir / SCORES_FILE, {**line, "source": "eval", "status": "ok", "recorded": time.time()})


def close_stopped_run(run_dir: Path, note: str, warn: Any, wait: float = SETTLE_SECONDS) -> bool:
    """The summary of a run its sweep stopped (ASHA): Ray ends a stopped trial's worker
    and every process under it, so `trnf train` writes none. Once the run's writers are
    gone (its lock is free; waiting at most ``wait`` seconds), the driver writes what
    happened, with the last checkpoint (`trnf train --resume` continues it), and indexes
    the run in the ledger. False when the writers were still there."""
    if not run_dir.is_dir() or read_summary(run_dir) is not None:
        return True
    deadline = time.monotonic() + wait
    while True:
        try:
            lock = runlock.acquire(run_dir, command="trnf sweep (closing a stopped trial)")
            break
        except runlock.RunLockedError:
            if time.monotonic() >= deadline:
                if wait > 0:
                    warn(f"{run_dir} is still being written {wait:.0f} s after its trial was stopped; left as it is")
                return False
            time.sleep(0.2)
    try:
        recipe = read_json(run_dir / RECIPE_FILE) or {}
        write_crash_summary(run_dir, name=recipe.get("name"), error=note,
                            last_good_checkpoint=latest_checkpoint(run_dir), status=INTERRUPTED)  # fmt: skip
    finally:
        lock.release()
    from trnfrontier.ledger.record import index_run

    index_run(run_dir, warn)
    return True
