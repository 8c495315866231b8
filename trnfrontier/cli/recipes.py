"""`trnf recipes list|show|validate|schema`: the shipped recipes, resolved, checked, described."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from trnfrontier.console import err, out, print_json
from trnfrontier.errors import TrnfError, UsageError

app = typer.Typer(
    help="List, show, validate recipes and print their JSON Schema.", no_args_is_help=True
)


def _split(args: list[str]) -> tuple[list[str], list[str]]:
    """Positional words -> (recipes, key.path=value overrides)."""
    refs = [a for a in args if "=" not in a]
    overrides = [a for a in args if "=" in a]
    return refs, overrides


@app.command("list")
def list_command(
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """The recipes that ship with trnf (use the name anywhere a recipe path goes)."""
    # The recipe library (pydantic) loads when a command runs, not for `trnf --help`.
    from trnfrontier.recipes.describe import count_params
    from trnfrontier.recipes.loading import load_recipe
    from trnfrontier.recipes.registry import shipped_recipes

    rows: list[dict[str, Any]] = []
    for name, path in shipped_recipes().items():
        recipe = load_recipe(path)
        rows.append(
            {
                "name": name,
                "path": str(path),
                "params": count_params(recipe),
                "device": recipe.runtime.device,
                "nproc": recipe.runtime.nproc,
                "budget_seconds": recipe.budget.seconds,
                "description": recipe.description,
            }
        )
    if json_output:
        print_json(rows)
        return
    table = Table(title="shipped recipes", title_justify="left")
    for column in ("name", "params", "device", "budget", "description"):
        table.add_column(column, justify="right" if column in ("params", "budget") else "left")
    for row in rows:
        table.add_row(
            row["name"],
            f"{row['params'] / 1e6:.1f}M",
            f"{row['device']} x {row['nproc']}",
            f"{row['budget_seconds']:g} s",
            row["description"],
        )
    out().print(table)


@app.command("show")
def show_command(
    args: list[str] = typer.Argument(
        ..., metavar="RECIPE [key.path=value ...]", help="A name or path, then overrides."
    ),
    json_output: bool = typer.Option(False, "--json", help="The resolved recipe as JSON."),
) -> None:
    """Print the resolved recipe (every key, defaults filled in, overrides applied)."""
    from trnfrontier.recipes.describe import count_params, resolved, resolved_yaml
    from trnfrontier.recipes.loading import load_recipe

    refs, overrides = _split(args)
    if len(refs) != 1:
        raise UsageError(
            f"`trnf recipes show` takes one recipe, got {len(refs)}: {' '.join(refs) or '(none)'} "
            "(overrides after it are key.path=value)"
        )
    recipe = load_recipe(refs[0], overrides)
    if json_output:
        print_json(resolved(recipe))
    else:
        sys.stdout.write(f"# {refs[0]} resolved; {count_params(recipe):,} parameters\n")
        sys.stdout.write(resolved_yaml(recipe))


@app.command("validate")
def validate_command(
    args: list[str] = typer.Argument(
        ..., metavar="RECIPE... [key.path=value ...]", help="Recipes, then overrides for all."
    ),
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Check recipes (with overrides) against the schema; exit 2 if any is invalid."""
    from trnfrontier.recipes.describe import count_params
    from trnfrontier.recipes.loading import load_recipe

    refs, overrides = _split(args)
    if not refs:
        raise UsageError("give at least one recipe to validate")
    results: list[dict[str, Any]] = []
    for ref in refs:
        try:
            recipe = load_recipe(ref, overrides)
        except TrnfError as exc:
            results.append({"recipe": ref, "valid": False, "error": str(exc)})
            continue
        results.append(
            {"recipe": ref, "valid": True, "name": recipe.name, "params": count_params(recipe)}
        )
    bad = [r for r in results if not r["valid"]]
    if json_output:
        print_json(results)
    else:
        console = out()
        for r in results:
            if r["valid"]:
                console.print(
                    f"[green]ok[/green]  {escape(r['recipe'])}  ({r['name']}, {r['params']:,} parameters)"
                )
        for r in bad:
            err().print(f"[red]invalid[/red]  {escape(r['error'])}")
    if bad:
        raise typer.Exit(2)


@app.command("schema")
def schema_command(
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write to this file instead of stdout."
    ),
) -> None:
    """The recipe's JSON Schema, for editor completion and validation."""
    from trnfrontier.recipes.describe import json_schema, write_json_schema

    if output:
        write_json_schema(output)
    else:
        sys.stdout.write(json_schema() + "\n")
