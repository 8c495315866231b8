"""`trnf prepare`: data shards, tokenizer and token files through the trusted prepare.py."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from trnfrontier.console import out, print_json
from trnfrontier.data_prep import run_prepare


def command(
    source: str = typer.Option("climbmix", "--source", help="climbmix (download), local (--path DIR) or sample (offline)."),
    path: str | None = typer.Option(None, "--path", help="Folder or file of .parquet/.jsonl/.txt for --source local."),
    val_path: str | None = typer.Option(
        None, "--val-path", help="--source local: folder or file of validation documents (default: 1 in 10 by hash)."
    ),
    documents: str | None = typer.Option(
        None,
        "--documents",
        help="--source local: how .txt files become documents: auto (paragraphs merged to ~4,000 chars), "
        "line, paragraph, file, or parquet (the `text` column of .parquet files).",
    ),
    num_train_shards: int | None = typer.Option(None, "--num-train-shards", help="ClimbMix training shards to download."),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="shipped (the SHA256-pinned artifacts/tokenizer.zip beside prepare.py), trained (a BPE of the "
        "dataset's own text) or auto (default: shipped, trained for --source local).",
    ),
    build_tokenizer_if_missing: bool = typer.Option(
        False,
        "--build-tokenizer-if-missing",
        help="When the shipped tokenizer artifact is missing or fails its SHA256 pin, train one instead of stopping.",
    ),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
) -> None:
    """Download or build the data, train the tokenizer and pre-tokenize (idempotent)."""
    summary = run_prepare(
        source, path, num_train_shards, show_progress=True, val_path=val_path, documents=documents,
        tokenizer=tokenizer, build_tokenizer_if_missing=build_tokenizer_if_missing,
    )
    if json_output:
        print_json(summary)
    else:
        out().print(summary_table(summary))


def summary_table(summary: dict[str, Any]) -> Table:
    """The final table `trnf prepare` prints."""
    table = Table(title="trnf prepare", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")

    def number(key: str) -> str:
        value = summary.get(key)
        return f"{value:,}" if isinstance(value, int) else "-"

    per_token = summary.get("bytes_per_token")
    rows = [
        ("source", str(summary.get("source", "-"))),
        ("dataset", str(summary.get("dataset_dir", "-"))),
        ("documents", number("documents")),
        ("bytes", number("bytes")),
        ("tokens", number("tokens")),
        ("bytes/token", f"{per_token:.3f}" if isinstance(per_token, float) else "-"),
        ("tokenizer", f"{summary['tokenizer']}: {summary.get('tokenizer_path', '-')}" if "tokenizer" in summary else "-"),
        ("tokenizer SHA256", str(summary.get("tokenizer_sha256", "-"))),
        ("prepare.py SHA256", str(summary.get("prepare_sha256", "-"))),
        ("prepare.py", str(summary.get("prepare_path", "-"))),
    ]
    if "reused" in summary:
        rows.append(("reused", "yes (verified against the manifest)" if summary["reused"] else "no (built now)"))
    for key, value in rows:
        table.add_row(key, value)
    return table
