"""`trnf train RECIPE [key.path=value ...]`: a budgeted training run into runs/<name>/."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.text import Text

from trnfrontier.cli import modes
from trnfrontier.cli.modes import check_mode
from trnfrontier.console import err, out, print_json
from trnfrontier.errors import TrnfError
from trnfrontier.hints import trnf_line
from trnfrontier.runtime.recipe import DEFAULT_PHASE
from trnfrontier.runtime.rundir import COMPLETED, CRASHED, DIVERGED


def _rerun_command(
    recipe: str | None, extras: list[str], run_dir: Path, nproc: int | None, lnc: int | None
) -> str:
    """The `trnf train` line that starts this run again in the same directory."""
    argv = ["train", *([recipe] if recipe else []), *extras, "--out", str(run_dir)]
    argv += ["--nproc", str(nproc)] if nproc is not None else []
    argv += ["--lnc", str(lnc)] if lnc is not None else []
    return trnf_line(*argv)


def command(
    ctx: typer.Context,
    recipe: str | None = typer.Argument(
        None, help="Recipe YAML path or shipped name (`trnf recipes list` shows them)."
    ),
    out_dir: Path | None = typer.Option(None, "--out", help="Run directory (default runs/<name>)."),
    name: str | None = typer.Option(None, "--name", help="Run name: the run goes to runs/NAME."),
    nproc: int | None = typer.Option(
        None, "--nproc", min=1, help="Processes (torchrun --nproc_per_node); sets runtime.nproc."
    ),
    lnc: int | None = typer.Option(
        None, "--lnc", help="NEURON_LOGICAL_NC_CONFIG (1 or 2); sets runtime.lnc."
    ),
    resume: Path | None = typer.Option(
        None, "--resume", help="Continue RUN_DIR from its latest checkpoint."
    ),
    json_output: bool = typer.Option(
        False, "--json", help="Print the run's summary as one JSON document on stdout."
    ),
    train_py: Path | None = typer.Option(
        None,
        "--train-py",
        help="Run a kit-style train.py under torchrun as the organisers do, instead of a recipe.",
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", help="--train-py: kill the run after this many seconds."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="--train-py: a few CPU steps in a clean environment."
    ),
    steps: int | None = typer.Option(None, "--steps", help="--train-py --dry-run: how many steps."),
    phase: int | None = typer.Option(
        None,
        "--phase",
        min=1,
        max=2,
        help="--train-py: the competition phase whose launch shapes and budget the run is held to "
        "(default 1; 2: 64 processes at LNC 2 or 128 at LNC 1, 14,400 s, inference.py beside train.py).",
    ),
) -> None:
    """Train a recipe within its budget. Override any key: `optim.matrix_lr=0.03 budget.seconds=120`.

    With --train-py, run a team's own train.py instead (its arguments after `--`)."""
    given = {
        "--resume": resume is not None,
        "--name": name is not None,
        "--timeout": timeout is not None,
        "--dry-run": dry_run,
        "--steps": steps is not None,
        "--phase": phase is not None,
    }
    check_mode(modes.TRAIN, "kit" if train_py is not None else "recipe", given)
    if train_py is not None:
        # After `--` every word is the script's, including one click took for RECIPE.
        script_args = ([recipe] if recipe is not None else []) + list(ctx.args)
        from trnfrontier.cli.train_kit import kit_command

        kit_command(
            train_py=train_py,
            nproc=nproc or 1,
            lnc=2 if lnc is None else lnc,
            out_dir=out_dir,
            timeout=timeout,
            dry_run=dry_run,
            steps=steps,
            args=script_args,
            json_output=json_output,
            phase=phase or DEFAULT_PHASE,
        )
        return

    _recipe_run(recipe, list(ctx.args), out_dir, name, nproc, lnc, resume, json_output)


def _recipe_run(
    recipe: str | None,
    extras: list[str],
    out_dir: Path | None,
    name: str | None,
    nproc: int | None,
    lnc: int | None,
    resume: Path | None,
    json_output: bool,
) -> None:
    """A recipe run: plan it, record it, run it, report it (TrnfError when it did not complete)."""
    # Imported here, not at the top: the training library imports torch, and `trnf --help`
    # must not pay for it.
    from trnfrontier.cli.train_view import summary_table
    from trnfrontier.train.interrupted import resume_note, stop_message
    from trnfrontier.train.plan import plan_from_arguments
    from trnfrontier.train.supervise import failure_message, run_plan, tail_log

    plan = plan_from_arguments(
        recipe, extras, out=out_dir, name=name, nproc=nproc, lnc=lnc, resume=resume
    )
    if plan.resume:
        err().print(resume_note(plan.run_dir) or f"resuming {plan.run_dir}")
    elif plan.replaces:
        err().print(f"starting again in {plan.run_dir} (the run there stopped before its first checkpoint)")

    # Made first: a folder that cannot be created (read-only, full, no permission) is the
    # one line the user sees, before anything else tries to write into it.
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    from trnfrontier.ledger import record

    def warn(line: str) -> None:
        err().print(line, style="yellow")

    record.start_train(plan, recipe, extras, nproc, lnc, warn)
    try:
        summary = run_plan(plan, live=True)
    except KeyboardInterrupt:
        err().print(stop_message(plan.run_dir, _rerun_command(recipe, extras, plan.run_dir, nproc, lnc)))
        raise
    finally:
        record.index_run(plan.run_dir, warn)  # every run is in the ledger, finished or not
    if summary.get("status") in (COMPLETED, DIVERGED):
        from trnfrontier.packaging.run_report import report_finished_run

        report_finished_run(plan.run_dir, quiet=json_output)
    if json_output:
        print_json(summary)
    else:
        out().print(summary_table(summary))
    rerun = _rerun_command(recipe, extras, plan.run_dir, nproc, lnc) if not plan.resume else None
    problem = failure_message(summary, plan.run_dir, rerun)
    if problem is not None:
        if summary.get("status") == CRASHED and not summary.get("expected_fault"):
            err().print(Text(tail_log(plan.run_dir), style="dim"))  # a bug: the worker's last words
        raise TrnfError(problem)
