"""`trnf prepare`: data shards, tokenizer and token files through the trusted prepare.py."""

from __future__ import annotations

import typer

from trnfrontier.console import out, print_json
from trnfrontier.data_prep import run_prepare, summary_table


def command(
    source: str = typer.Option("climbmix", "--source", help="climbmix (download), local (--path DIR) or sample (offline)."),
    path: str | None = typer.Option(None, "--path", help="Folder of .parquet/.jsonl/.txt files for --source local."),
    num_train_shards: int | None = typer.Option(None, "--num-train-shards", help="ClimbMix training shards to download."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
) -> None:
    """Download or build the data, train the tokenizer and pre-tokenize (idempotent)."""
    summary = run_prepare(source, path, num_train_shards, show_progress=True)
    if json_output:
        print_json(summary)
    else:
        out().print(summary_table(summary))
