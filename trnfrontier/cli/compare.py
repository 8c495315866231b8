"""`trnf compare A B [--seeds N]`: is B better than A, by how much, and how sure."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trnfrontier.console import err, keep_wide, out, print_json
from trnfrontier.errors import UsageError


def render(document: dict[str, Any], console: Console) -> None:
    keep_wide(console, 160)
    setting = document["setting"]
    tokens = setting.get("num_tokens")
    if document.get("metric") == "core":
        from trnfrontier.ledger.scores import describe_core_setting

        title = f"CORE, {describe_core_setting(setting)} (higher is better)"
    elif isinstance(tokens, int):
        title = f"val_bpb on {setting.get('split')}, {tokens:,} tokens, seq_len {setting.get('seq_len')} (lower is better)"
    else:
        title = "val_bpb (lower is better)"
    table = Table(title=title, title_justify="left")
    for column in ("side", "runs", "mean", "sd", "min", "max", "seeds"):
        table.add_column(column, justify="left" if column in ("side", "seeds") else "right")
    for side in ("a", "b"):
        s = document[side]
        seeds = ", ".join(str(r["seed"]) for r in s["runs"])
        sd = f"{s['sd']:.5f}" if s["sd"] is not None else "-"
        table.add_row(f"{side.upper()}: {escape(s['label'])}", str(s["n"]), f"{s['mean']:.6f}", sd,
                      f"{s['minimum']:.6f}", f"{s['maximum']:.6f}", seeds)  # fmt: skip
    console.print(table)
    for side in ("a", "b"):
        if document[side]["unscored"]:
            console.print(f"{side.upper()}: left out, no score at this setting: {', '.join(document[side]['unscored'])}")
    for line in document["outliers"]:
        console.print(f"[yellow]{escape(line)}[/yellow]")
    d = document["difference"]
    tests = {"welch": "Welch's t-test", "paired": "paired t-test by seed (each seed's B - A)",
             "pooled-from-one-side": "t-test with the spread of the side that has several runs"}  # fmt: skip
    if d["method"] in tests:
        console.print(f"test: {tests[d['method']]}, {d['df']:.1f} degrees of freedom")
    style = "bold green" if document["verdict"].endswith("better") else "bold yellow" if document["verdict"] == "confounded" else "bold"
    console.print(f"[{style}]{escape(document['message'])}[/{style}]")
    if document.get("caveat"):
        console.print(escape(document["caveat"]), style="dim")
    projection = document["projection"]
    if not projection["available"]:
        console.print(projection["message"])
        return
    fit = projection["fit"]
    for side in ("a", "b"):
        value, half = projection[side]
        spread = f" ± {half:.4f}" if half is not None else " (uncertainty unknown: one official pair)"
        console.print(f"projected official {side.upper()}: {value:.4f}{spread}")
    console.print(
        f"(official = local {fit['offset']:+.4f} from {fit['pairs']} recorded pair{'s' if fit['pairs'] != 1 else ''}; "
        "a constant offset leaves the difference B - A as above)"
    )


def command(
    a: str = typer.Argument(..., help="Side A: a run (its seeds), a glob of run names, a comma list, or a recipe with overrides in one quoted argument ('muon_gqa optim.matrix_lr=0.03')."),
    b: str = typer.Argument(..., help="Side B, as A."),
    seeds: int | None = typer.Option(None, "--seeds", min=1, help="First train the seeds each side lacks to have N runs."),
    tokens: int | None = typer.Option(None, "--tokens", min=1, help="Compare scores of this many evaluation tokens."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="Compare scores at this sequence length."),
    confidence: float = typer.Option(0.95, "--confidence", min=0.5, max=0.999, help="Confidence level of the interval and test."),
    resolve: float | None = typer.Option(None, "--resolve", help="The difference worth resolving, in val_bpb (default: the observed one)."),
    unpaired: bool = typer.Option(False, "--unpaired", help="Welch's test even when both sides ran the same seeds (default there: paired by seed)."),
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
    metric: str = typer.Option("val_bpb", "--metric", help="val_bpb (lower is better) or core (nanochat's CORE from `trnf eval --core`, higher is better)."),
) -> None:
    """Is B better than A, by how much, how sure (and on the leaderboard, where official scores were recorded).

    Each side's mean and spread, the difference B - A with a confidence interval and
    Welch's t-test, a plain verdict, and how many more seeds would settle it. Refuses
    scores measured on different data, lengths or prepare.py."""
    from trnfrontier.ledger.compare import compare
    from trnfrontier.ledger.groups import resolve_group
    from trnfrontier.ledger.record import load_runs

    if metric not in ("val_bpb", "core"):
        raise UsageError(f"--metric {metric}: choose val_bpb or core")
    if metric == "core" and (tokens is not None or seq_len is not None):
        raise UsageError("--tokens and --seq-len select val_bpb scores; CORE scores are compared at their bundle, crop and subsample")
    if resolve is not None and not resolve > 0:
        raise UsageError(f"--resolve {resolve}: give a positive difference in val_bpb (0.001, say)")
    notes = err()

    def note(line: str) -> None:
        notes.print(line, style="yellow")

    runs = load_runs(note=note)
    group_a, group_b = resolve_group(runs, a), resolve_group(runs, b)
    if seeds is not None:
        from trnfrontier.ledger.seeds import fill_seeds

        if fill_seeds(group_a, group_b, seeds, say=lambda line: notes.print(line), warn=note):
            runs = load_runs()
            group_a, group_b = resolve_group(runs, a), resolve_group(runs, b)
    document = compare(group_a, group_b, tokens=tokens, seq_len=seq_len, confidence=confidence, resolve=resolve,
                       all_runs=runs, unpaired=unpaired, metric=metric)  # fmt: skip
    if json_output:
        print_json(document)
    else:
        render(document, out())
