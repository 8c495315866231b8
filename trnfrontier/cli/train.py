"""`trnf train RECIPE [key.path=value ...]`: a budgeted training run into runs/<name>/."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.text import Text

from trnfrontier.console import err, out, print_json
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.training import (
    failure_message,
    plan_new_run,
    plan_resume,
    run_plan,
    split_overrides,
    summary_table,
    tail_log,
)


def command(
    ctx: typer.Context,
    recipe: str | None = typer.Argument(None, help="Recipe YAML path or shipped name (cpu_smoke, baseline_d10, muon_gqa)."),
    out_dir: Path | None = typer.Option(None, "--out", help="Run directory (default runs/<name>)."),
    name: str | None = typer.Option(None, "--name", help="Run name: the run goes to runs/NAME."),
    nproc: int | None = typer.Option(None, "--nproc", min=1, help="Processes (torchrun --nproc_per_node); sets runtime.nproc."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue RUN_DIR from its latest checkpoint."),
    json_output: bool = typer.Option(False, "--json", help="Print the run's summary as one JSON document on stdout."),
) -> None:
    """Train a recipe within its budget. Override any key: `optim.matrix_lr=0.03 budget.seconds=120`."""
    extras = list(ctx.args)
    if recipe is not None and "=" in recipe and not Path(recipe).exists():
        extras.insert(0, recipe)  # `trnf train --resume DIR key=value`: no recipe was given
        recipe = None
    overrides = split_overrides(extras)
    if resume is not None:
        if recipe is not None:
            raise UsageError("--resume RUN_DIR uses the run's own recipe.json; give no RECIPE with it")
        if out_dir is not None or name is not None:
            raise UsageError("--resume RUN_DIR continues in RUN_DIR; --out and --name do not apply")
        plan = plan_resume(resume, overrides, nproc)
    else:
        if recipe is None:
            raise UsageError("give a RECIPE (a YAML path or a shipped name; `trnf recipes list`), or --resume RUN_DIR")
        plan = plan_new_run(recipe, overrides, out=out_dir, name=name, nproc=nproc)

    try:
        summary = run_plan(plan, live=True)
    except KeyboardInterrupt:
        err().print(f"training stopped; continue it with `trnf train --resume {plan.run_dir}` (from its latest checkpoint)")
        raise
    if json_output:
        print_json(summary)
    else:
        out().print(summary_table(summary))
    problem = failure_message(summary, plan.run_dir)
    if problem is not None:
        if summary.get("status") == "crashed":
            err().print(Text(tail_log(plan.run_dir), style="dim"))  # the worker's last words
        raise TrnfError(problem)
