"""`trnf recipes` (not built yet: issue #3)."""

from __future__ import annotations

import typer

from trnfrontier.errors import not_built

app = typer.Typer(help="List, show, validate recipes and print their JSON Schema.", no_args_is_help=True)


@app.command("list")
def list_command() -> None:
    """Not built yet (issue #3)."""
    raise not_built("recipes list", 3)
