"""`trnf sweep SPEC.yaml` / `trnf sweep --resume DIR` / `trnf sweep status DIR`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trnfrontier.console import err, keep_wide, out, print_json
from trnfrontier.errors import UsageError


def _fmt(value: Any, spec: str = ".4f") -> str:
    return "-" if not isinstance(value, (int, float)) else format(value, spec)


def render(outcome: Any, console: Console) -> None:
    from trnfrontier.sweep.report import varying

    keep_wide(console, 200)
    spec, rows = outcome.spec, outcome.rows
    keys = varying(rows)
    better = "lower" if spec.direction == "min" else "higher"
    table = Table(title=f"sweep {outcome.sweep.sweep_id}: {spec.metric} ({better} is better)", title_justify="left")
    for column in ("trial", *keys, "status", spec.metric, "steps", "note"):
        table.add_column(column, justify="right" if column in (spec.metric, "steps") else "left")
    for row in rows:
        note = row["error"] or ""
        if row["status"] == "stopped":
            note = f"ASHA stopped it at {_fmt(row['fraction'], '.0%')} (train loss {_fmt(row['train_loss'])})"
        elif row["confounded"]:
            note = "CONFOUNDED: steps differ from the best's by more than 10%"
        status = row["status"] if row["status"] == "completed" else f"[yellow]{row['status']}[/yellow]"
        table.add_row(escape(row["trial"]), *(escape(str(row["params"].get(k, "-"))) for k in keys), status,
                      _fmt(row[spec.metric], ".6f"), _fmt(row["steps"], ","), escape(note))  # fmt: skip
    console.print(table)
    if outcome.progress is not None:
        console.print(escape(outcome.progress), highlight=False, soft_wrap=True)
    for label, path in (("best recipe", outcome.best_recipe), ("figure", outcome.figure)):
        if path is not None:
            console.print(f"{label}: {path}")


def _document(outcome: Any) -> dict[str, Any]:
    return {
        "id": outcome.sweep.sweep_id, "folder": str(outcome.sweep.folder), "metric": outcome.spec.metric,
        "mode": outcome.spec.direction, "trials": outcome.rows,
        "best_recipe": str(outcome.best_recipe) if outcome.best_recipe else None,
        "figure": str(outcome.figure) if outcome.figure else None, "progress": outcome.progress,
    }  # fmt: skip


def command(
    spec: str | None = typer.Argument(None, help="The sweep spec (YAML; see sweeps/), or `status` followed by a sweep folder."),
    folder: Path | None = typer.Argument(None, help="With `status`: the sweep folder to show."),
    out_dir: Path | None = typer.Option(None, "--out", help="The sweep's folder (default runs/<name>-<date>)."),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the sweep in this folder."),
    address: str | None = typer.Option(None, "--address", help="Join a Ray cluster (auto, or HOST:PORT) instead of an embedded Ray."),
    json_output: bool = typer.Option(False, "--json", help="The final table as one JSON document on stdout."),
) -> None:
    """Many training runs in parallel on Ray: a search over recipe keys (grid, random,
    Optuna TPE), ASHA early stopping, every trial an ordinary run in the ledger.

    `trnf sweep status DIR` shows a sweep in flight or finished."""
    from trnfrontier.sweep import driver
    from trnfrontier.sweep.engine import say_line

    if spec == "status":
        if folder is None:
            raise UsageError("`trnf sweep status DIR`: give the sweep folder")
        outcome = driver.status(folder)
    elif resume is not None:
        if spec is not None or out_dir is not None:
            raise UsageError("--resume DIR continues the sweep there with its own spec; give no SPEC or --out")
        outcome = driver.resume(resume, address, say_line)
    else:
        if spec is None or folder is not None:
            raise UsageError("give one sweep SPEC (a YAML file), `--resume DIR`, or `status DIR`")
        outcome = driver.start(Path(spec), out_dir, address, say_line)
    if json_output:
        print_json(_document(outcome))
    else:
        render(outcome, out())
    failed = [row for row in outcome.rows if row["status"] == "failed"]
    if failed and spec != "status":
        err().print(f"{len(failed)} trial{'s' if len(failed) != 1 else ''} failed (see the note column)", style="yellow")
