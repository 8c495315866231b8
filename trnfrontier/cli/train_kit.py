"""What `trnf train --train-py` prints and how it exits (cli/train.py branches here).

Live output of the ranks goes to stderr as it arrives; the result (a table, or one JSON
document with ``--json``) goes to stdout; a failure ends with the failing rank's last log
lines on stderr and one ``trnf: error:`` line with a non-zero exit code.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from trnfrontier.console import err, out, print_json
from trnfrontier.contract.phases import DEFAULT_PHASE
from trnfrontier.contract.phases import phase as phase_rules
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.hints import trnf_line
from trnfrontier.kit.console import ConsoleView
from trnfrontier.kit.dryrun import STAGES, DryRunReport, dry_run_kit
from trnfrontier.kit.harness import dry_run_ranks
from trnfrontier.kit.train_kit import (
    KitInterrupted,
    KitOptions,
    KitRun,
    phase_notes,
    rerun_command,
    train_kit,
    validate_shape,
)
from trnfrontier.progress import steps as progress_steps
from trnfrontier.runtime.rundir import CRASHED

DRY_RUN_TIMEOUT_SECONDS = 600.0


def _print_tail(console: Console, log: Path | None, lines: list[str]) -> None:
    if not lines:
        return
    console.print(f"last lines of {log}:" if log else "last lines:", style="bold")
    for line in lines:
        console.print(Text("  " + line))


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _budget_source(summary: dict[str, Any]) -> str:
    """Which accounting charged the run and how its step log was read (or why there is none)."""
    if summary.get("accounting") is None:
        return "- (no usable step log)"
    return f"{summary['accounting']}; step log: {summary.get('step_log') or '-'}"


def _run_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"kit run {summary['name']}: {summary['status']}", show_header=False)
    rows = [
        ("launch", summary["launch"]),
        ("steps", str(summary["steps"])),
        ("final loss", _fmt(summary["final_loss"], ".4f")),
        ("charged / budget", f"{_fmt(summary['charged_seconds'], '.1f')} / {_fmt(summary['budget_seconds'], 'g')} s"),
        ("startup (excluded up to the cap)", f"{_fmt(summary['startup_seconds'], '.1f')} s"),
        ("headroom", f"{_fmt(summary['headroom_seconds'], '.1f')} s"),
        ("over budget", str(summary["over_budget"])),
        ("budget from", _budget_source(summary)),
        ("tokens/s", _fmt(summary["tokens_per_second"], ",.0f")),
        ("params", _fmt(summary["params"], ",")),
        ("val_bpb printed by train.py", _fmt(summary["reported_val_bpb"], ".4f") + " (untrusted)"),
        ("checkpoint", summary["final_checkpoint"] or "-"),
        ("not found in the output", ", ".join(summary["missing_fields"]) or "-"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


def _stage_table(report: DryRunReport) -> Table:
    table = Table(title="dry run (CPU, gloo, clean environment)")
    for column in ("stage", "result", "detail"):
        table.add_column(column)
    marks = {True: "[green]pass[/green]", False: "[bold red]FAIL[/bold red]", None: "[dim]-[/dim]"}
    for stage in report.stages:
        table.add_row(stage.name, marks[stage.passed], Text(stage.detail))
    return table


def _train(options: KitOptions, json_output: bool) -> KitRun:
    live = err()
    try:
        # The script's own lines live; tracebacks and torchrun's reports stay in the run's logs.
        run = train_kit(options, on_line=ConsoleView(lambda line: live.print(Text(line))))
    except KitInterrupted as stopped:
        live.print(
            f"interrupted: every process of the run was stopped ({stopped.run_dir / 'summary.json'} says how far it got); "
            f"start it again with `{rerun_command(options, stopped.run_dir)}`"
        )
        raise
    for note in run.notes:
        live.print(f"note: {note}")
    if json_output:
        print_json(run.summary)
    else:
        out().print(_run_table(run.summary))
    return run


def _dry_run_shape(train_py: Path, nproc: int, lnc: int, phase: int) -> int:
    """The CPU ranks a dry run starts, after the launch shape is checked against ``phase``
    (Phase 1: all of them, silently, as ever; another phase: its notes said, as a real run
    says them, and its 64 or 128 processes stood in for by a few)."""
    rules = phase_rules(phase)
    if rules.number == DEFAULT_PHASE:
        validate_shape(nproc, lnc)
        return nproc
    for note in phase_notes(train_py.expanduser().resolve(), nproc, lnc, rules):
        err().print(f"note: {note}")
    ranks = dry_run_ranks(nproc, rules)
    if ranks < nproc:
        err().print(f"note: {nproc} processes do not fit a CPU: the dry run runs train.py on {ranks} rank(s), "
                    f"as `trnf verify` does for Phase {rules.number}")
    return ranks


def kit_command(
    *, train_py: Path, nproc: int, lnc: int, out_dir: Path | None, timeout: float | None,
    dry_run: bool, steps: int | None, args: list[str], json_output: bool, phase: int = DEFAULT_PHASE,
) -> None:
    """`trnf train --train-py ...` and `... --dry-run`: raises TrnfError on any failure."""
    if steps is not None and not dry_run:
        raise UsageError("--steps limits a --dry-run; a real run's own flags go after `--`")
    if not dry_run:
        run = _train(KitOptions(train_py, nproc, lnc, out_dir, timeout, tuple(args), phase), json_output)
        if run.problems:
            if run.summary.get("status") != CRASHED:  # a crash's traceback is in the log its line names
                _print_tail(err(), run.failure_log, run.failure_tail)
            more = f" (+{len(run.problems) - 1} more in {run.run_dir / 'summary.json'})" if len(run.problems) > 1 else ""
            raise TrnfError(run.problems[0] + more, exit_code=run.exit_code)
        from trnfrontier.packaging.run_report import report_finished_run

        report_finished_run(run.run_dir, quiet=json_output)
        checkpoint = run.summary["final_checkpoint"]
        score = trnf_line("eval", "--train-py", str(train_py), "--checkpoint", str(checkpoint))
        err().print(f"run directory {run.run_dir}; score it: {score}")
        return

    ranks = _dry_run_shape(train_py, nproc, lnc, phase)
    limit = timeout if timeout is not None else DRY_RUN_TIMEOUT_SECONDS
    if out_dir is not None:
        work = out_dir.expanduser().resolve()
        if work.exists() and any(work.iterdir()):
            raise UsageError(f"--out {work} is not empty; a dry run needs an empty directory to keep")
        work.mkdir(parents=True, exist_ok=True)
    else:
        # Removed when the dry run passes; kept when it fails, so the log it names exists.
        work = Path(tempfile.mkdtemp(prefix="trnf-dry-run-"))
    try:
        with progress_steps(f"dry run of {train_py} on {ranks} CPU rank(s)", len(STAGES)) as bar:
            report = dry_run_kit(train_py, work, nproc=ranks, lnc=lnc, steps=steps or 3, timeout=limit,
                                 args=tuple(args), progress=bar)
    except BaseException:
        if out_dir is None:
            shutil.rmtree(work, ignore_errors=True)
        raise
    if json_output:
        print_json({"passed": report.passed, "stages": [vars(s) for s in report.stages]})
    else:
        out().print(_stage_table(report))
    failure = report.first_failure()
    if out_dir is None and (failure is None or report.failure_log is None):
        shutil.rmtree(work, ignore_errors=True)  # nothing worth keeping
    if failure is None:
        return
    _print_tail(err(), report.failure_log, report.failure_tail)
    log = f" (log: {report.failure_log})" if report.failure_log is not None else ""
    raise TrnfError(f"dry run failed at {failure.name}: {failure.detail}{log}")
