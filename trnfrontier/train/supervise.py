"""Running a planned `trnf train` recipe run: start the child, follow it, read its summary.

The training itself runs in a child process (``python -m trnfrontier.train.worker``, the
runtime's entry point bound to its parent's life, or torchrun for ``--nproc N > 1``) in its
own process group, so that Ctrl-C or an error here ends every worker and nothing is
orphaned; a ``kill -9`` of trnf takes them too (``lifeline``). One writer per run
directory: trnf takes the run's lock (``runtime.runlock``) and hands it to the trainer.
This side writes ``recipe.json``, shows a live view by tailing ``metrics.jsonl`` and
reads back ``summary.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.live import Live
from rich.table import Table

from trnfrontier import processes
from trnfrontier.console import err
from trnfrontier.errors import TrnfError
from trnfrontier.hints import trnf_line
from trnfrontier.runtime import runlock
from trnfrontier.runtime.atomic import atomic_write_json
from trnfrontier.runtime.checkpoint_ref import latest_checkpoint
from trnfrontier.runtime.metrics import truncate_after
from trnfrontier.runtime.rundir import (
    COMPILE_MARK,
    COMPLETED,
    DIVERGED,
    FINAL_EVAL_MARK,
    FIRST_STEP_MARK,
    INTERRUPTED,
    LOG_FILE,
    METRICS_FILE,
    RECIPE_FILE,
    SUMMARY_FILE,
    read_summary,
    write_crash_summary,
)
from trnfrontier.train.interrupted import checkpoint_meta, clear_stopped_run
from trnfrontier.train.plan import RunPlan

# How long the workers get to exit after SIGTERM before SIGKILL.
TERMINATE_GRACE_SECONDS = 10.0
# After Ctrl-C, how long the trainer gets to finish its step and write its checkpoint
# (runtime/interrupt.py) before it is stopped as after a second Ctrl-C.
INTERRUPT_WAIT_SECONDS = 120.0


class LineTail:
    """The complete lines appended to a file since the last call (from its size when made;
    a half-written last line waits for its end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.partial = b""

    def lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        return lines


class MetricsTail(LineTail):
    """New records of metrics.jsonl since the last call."""

    def read(self) -> list[dict[str, Any]]:
        records = []
        for line in self.lines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records


# Phases that last minutes with no new metrics: the line that starts each one, and the
# line that ends the first (the first step done; the final evaluation ends with the run).
_PHASE_STARTS = (COMPILE_MARK, FINAL_EVAL_MARK)
_PHASE_ENDS = (FIRST_STEP_MARK,)


class PhaseWatch:
    """The worker's announced phase (the first step's compile, the final evaluation) from
    new lines of train.log: minutes in which metrics.jsonl gets nothing new, so the view
    says what is going on and for how long."""

    def __init__(self, path: Path) -> None:
        self.tail = LineTail(path)
        self.phase: str | None = None
        self.since: float | None = None

    def read(self) -> list[str]:
        """The phase lines (starts and ends) that appeared since the last call, in order."""
        found = []
        for line in (raw.decode("utf-8", "replace") for raw in self.tail.lines()):
            if line.startswith(_PHASE_STARTS):
                self.phase, self.since = line.strip(), time.time()
                found.append(line.strip())
            elif line.startswith(_PHASE_ENDS):
                self.phase, self.since = None, None
                found.append(line.strip())
        return found

    def elapsed(self) -> float:
        return time.time() - (self.since or time.time())


def live_view(
    last: dict[str, Any] | None,
    budget: float,
    run_dir: Path,
    started: float,
    best_val: float | None,
    phase: PhaseWatch | None = None,
) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("run", str(run_dir))
    if phase is not None and phase.phase is not None:
        table.add_row("status", f"{phase.phase} ({phase.elapsed():.0f} s)")
    elif not last:
        table.add_row("status", f"starting ({time.time() - started:.0f} s): imports, data, the first step")
    if not last:
        return table
    charged = last.get("charged_seconds") or 0.0
    table.add_row(
        "step", f"{last['step']:,}" + ("  (startup, not charged)" if last.get("startup") else "")
    )
    loss = last.get("loss")
    table.add_row("loss", "nan" if loss is None else f"{loss:.4f}")
    table.add_row("lr", f"{last.get('lr', 0.0):.3g}")
    tps = last.get("tokens_per_second")
    mfu = last.get("mfu")
    table.add_row(
        "tok/s", ("-" if not tps else f"{tps:,.0f}") + (f"   mfu {100 * mfu:.1f}%" if mfu else "")
    )
    table.add_row("charged", f"{charged:,.1f} / {budget:,.0f} s")
    table.add_row("headroom", f"{budget - charged:,.1f} s")
    if best_val is not None:
        table.add_row("val_bpb", f"{best_val:.4f}")
    return table


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """End the child and everything it started (torchrun runs each worker in its own
    session, so its process group alone does not reach them): TERM, then KILL."""
    if proc.poll() is not None:
        return
    processes.stop_tree(proc, grace=TERMINATE_GRACE_SECONDS)


def run_plan(
    plan: RunPlan,
    *,
    live: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    poll_seconds: float = 0.5,
) -> dict[str, Any]:
    """Take the run directory's lock, write recipe.json (new runs), start the child,
    follow it, return its summary."""
    try:
        lock = runlock.acquire(plan.run_dir, command=" ".join(["trnf", *sys.argv[1:]]))
    except runlock.RunLockedError as exc:
        raise TrnfError(str(exc)) from None
    if lock.took_over:
        err().print(f"[yellow]{lock.took_over}[/yellow]")
    try:
        return _run_locked(plan, {runlock.TOKEN_ENV: lock.token}, live, on_record, poll_seconds)
    finally:
        lock.release()


# Off a terminal (CI, a pipe): a step line at most this often, so a short run shows its
# progress and a long one does not flood the log; and a line at least this often while
# nothing new happens (a compile, the final evaluation), saying so with the time it took.
PLAIN_STEP_SECONDS = 5.0
PLAIN_QUIET_SECONDS = 30.0


class _Follower:
    """What `trnf train` shows while its worker runs: a live view on a terminal, else plain
    lines (CI, a pipe); every new metrics record goes to ``on_record``."""

    def __init__(
        self, run_dir: Path, budget: float, live: bool, on_record: Callable[[dict[str, Any]], None] | None
    ) -> None:
        # Made before the worker starts: the tails read only what this run appends.
        self.run_dir, self.budget, self.live, self.on_record = run_dir, budget, live, on_record
        self.tail = MetricsTail(run_dir / METRICS_FILE)
        self.watch = PhaseWatch(run_dir / LOG_FILE)
        self.started = time.time()
        self.console = err()
        self.last: dict[str, Any] | None = None
        self.best_val: float | None = None
        self.last_note, self.noted_step = time.time(), None
        self.display: Live | None = None

    def start(self) -> None:
        if self.live and self.console.is_terminal:
            self.display = Live(
                live_view(None, self.budget, self.run_dir, self.started, None),
                console=self.console,
                refresh_per_second=4,
                transient=False,
            )
            self.display.start()
        self.last_note = time.time()

    def stop(self) -> None:
        if self.display is not None:
            self.display.stop()

    def update(self, finished: bool) -> None:
        for record in self.tail.read():
            self.last = record
            if record.get("val_bpb") is not None:
                best = self.best_val
                self.best_val = record["val_bpb"] if best is None else min(best, record["val_bpb"])
            if self.on_record is not None:
                self.on_record(record)
        announced = self.watch.read()
        if self.display is not None:
            self.display.update(live_view(self.last, self.budget, self.run_dir, self.started, self.best_val, self.watch))
        elif self.live:
            self._plain(finished, announced)

    def _plain(self, finished: bool, announced: list[str]) -> None:
        """Off a terminal: the latest step (at most every PLAIN_STEP_SECONDS, and before a
        phase line, so the lines read in order), each phase line, and while nothing new comes
        for PLAIN_QUIET_SECONDS, what is going on and for how long."""
        now, last = time.time(), self.last
        if last is not None and last["step"] != self.noted_step and (
            finished or announced or now - self.last_note >= PLAIN_STEP_SECONDS
        ):
            loss = last.get("loss")
            startup = "  (startup, not charged)" if last.get("startup") else ""
            self.console.print(
                f"step {last['step']}  loss {'nan' if loss is None else f'{loss:.4f}'}  "
                f"charged {last.get('charged_seconds') or 0:.0f}/{self.budget:g} s{startup}"
            )
            self.last_note, self.noted_step = now, last["step"]
        for line in announced:
            self.console.print(line)
            self.last_note = now
        if finished or now - self.last_note < PLAIN_QUIET_SECONDS:
            return
        if self.watch.phase is not None:
            self.console.print(f"{self.watch.phase} ({self.watch.elapsed():.0f} s so far)")
        elif last is None:
            self.console.print(f"starting ({now - self.started:.0f} s): imports, data, the first step")
        else:
            self.console.print(f"step {last['step']} is the latest ({now - self.last_note:.0f} s without a new record)")
        self.last_note = now


def _run_locked(
    plan: RunPlan,
    lock_env: dict[str, str],
    live: bool,
    on_record: Callable[[dict[str, Any]], None] | None,
    poll_seconds: float,
) -> dict[str, Any]:
    run_dir = plan.run_dir
    if plan.replaces:
        clear_stopped_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not plan.resume:
        atomic_write_json(run_dir / RECIPE_FILE, plan.recipe.model_dump(mode="json"))
    previous_summary = (
        (run_dir / SUMMARY_FILE).stat().st_mtime_ns if (run_dir / SUMMARY_FILE).exists() else None
    )
    env = {**os.environ, **plan.env, **lock_env}
    if plan.resume:
        _cut_metrics_to_checkpoint(run_dir)
    follow = _Follower(run_dir, plan.recipe.budget.seconds, live, on_record)
    with open(run_dir / LOG_FILE, "ab") as log:
        log.write(f"$ {' '.join(plan.command)}\n".encode())
        log.flush()
        proc = processes.start(
            plan.command, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=None, die_with_parent=True
        )
        with processes.sigterm_as_interrupt():
            try:
                follow.start()
                while True:
                    finished = proc.poll() is not None
                    follow.update(finished)
                    if finished:
                        break
                    time.sleep(poll_seconds)
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    follow.stop()
                    err().print(
                        "stopping: the trainer finishes its step and writes that step's checkpoint "
                        "(Ctrl-C again to stop at once)"
                    )
                    processes.interrupt_and_wait(proc, INTERRUPT_WAIT_SECONDS)
                _terminate(proc)
                if isinstance(exc, KeyboardInterrupt) and not _fresh_summary(run_dir, previous_summary):
                    # The worker stops without a summary on Ctrl-C; the run directory says
                    # what happened, and that it may be restarted when it has no checkpoint.
                    write_crash_summary(
                        run_dir,
                        name=plan.recipe.name,
                        error="interrupted (Ctrl-C or SIGTERM)",
                        last_good_checkpoint=latest_checkpoint(run_dir),
                        status=INTERRUPTED,
                    )
                raise
            finally:
                follow.stop()
    return _worker_summary(plan, proc.returncode, previous_summary)


def _cut_metrics_to_checkpoint(run_dir: Path) -> None:
    """What the resumed trainer does first (drop the records past its checkpoint's step),
    done here before it starts, so that the live view follows from the right place."""
    latest = latest_checkpoint(run_dir)
    step = checkpoint_meta(latest).get("step") if latest is not None else None
    if isinstance(step, int):
        truncate_after(run_dir / METRICS_FILE, step)


def _worker_summary(plan: RunPlan, returncode: int, previous_summary: int | None) -> dict[str, Any]:
    """The summary the worker wrote, or a crash summary when it wrote none (a kill, a crash
    before the trainer could write one); with the run dir and the worker's exit code."""
    run_dir = plan.run_dir
    summary = read_summary(run_dir)
    if not _fresh_summary(run_dir, previous_summary) or summary is None:
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        summary = write_crash_summary(
            run_dir,
            name=plan.recipe.name,
            error=f"the training process ended without a summary ({how}); see {run_dir / LOG_FILE}",
            last_good_checkpoint=latest_checkpoint(run_dir),
        )
    summary.setdefault("run_dir", str(run_dir))
    summary["exit_code"] = returncode
    return summary


def _fresh_summary(run_dir: Path, previous_mtime_ns: int | None) -> bool:
    """True when the worker wrote summary.json since the run started."""
    try:
        return (run_dir / SUMMARY_FILE).stat().st_mtime_ns != previous_mtime_ns
    except OSError:
        return False


def failure_message(summary: dict[str, Any], run_dir: Path, rerun: str | None = None) -> str | None:
    """One line for a run that did not complete (None when it did), ending with the next
    step that works: ``--resume`` from its checkpoint, else ``rerun`` (the command that
    started it, which starts it again in the same folder)."""
    status = summary.get("status")
    if status == COMPLETED:
        return None
    if status == DIVERGED:
        where = summary.get("last_good_checkpoint") or "none"
        return (
            f"training diverged at step {summary.get('diverged_step')} (loss NaN/inf or above run.max_loss); "
            f"last good checkpoint: {where}. Lower the LRs, or resume with `trnf train --resume {run_dir}`"
        )
    detail = summary.get("error") or "unknown error"
    fault = bool(summary.get("expected_fault"))  # its one line is the whole story
    when = "once that is fixed, " if fault else ""
    if summary.get("last_good_checkpoint"):
        hint = f"; {when}resume with `{trnf_line('train', '--resume', str(run_dir))}`"
    elif rerun:
        hint = f"; {when}start it again with `{rerun}` (no checkpoint to resume)"
    else:
        hint = ""
    if fault:
        return f"training stopped: {detail} (traceback in {run_dir / LOG_FILE}){hint}"
    return f"training {status}: {detail} (log: {run_dir / LOG_FILE}){hint}"


def tail_log(run_dir: Path, lines: int = 15) -> str:
    try:
        text = (run_dir / LOG_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
