"""`trnf runs`: the ledger of local runs; `runs show|score|rebuild|record-official|plot`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trnfrontier.console import err, keep_wide, out, print_json
from trnfrontier.runtime.rundir import COMPLETED

app = typer.Typer(
    help="The ledger of local runs: list, show, rebuild, record official scores, plot, Phase 2 score against a pool.",
    invoke_without_command=True,
)


def _note(line: str) -> None:
    err().print(line, style="yellow")


def _short(value: str | None, n: int = 8) -> str:
    return value[:n] if value else "-"


def _num(value: Any, spec: str) -> str:
    if not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _projected(run: dict[str, Any]) -> str:
    if not run.get("projected"):
        return "-"
    value, half = run["projected"]
    return f"{value:.4f}" + (f" ± {half:.4f}" if half is not None else " (± ?)")


def render_list(runs: list[dict[str, Any]], fits_line: str, console: Console) -> None:
    keep_wide(console, 220)
    table = Table(title=f"trnf runs ({len(runs)})", title_justify="left")
    columns = ("name", "recipe", "seed", "vs parent", "status", "steps", "tok/s", "charged s", "val_bpb",
               "eval", "official (proj.)", "CORE", "commit", "device", "prepare")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right" if column in ("seed", "steps", "tok/s", "charged s", "val_bpb", "CORE") else "left")
    from trnfrontier.ledger.listing import short_diff
    from trnfrontier.ledger.scores import describe_setting

    for run in runs:
        status = (run.get("status") or "?") + ("" if run.get("present", True) else " (folder gone)")
        commit = _short(run.get("git_commit")) + ("*" if run.get("git_dirty") else "")
        device = f"{run.get('device') or '?'} x{run.get('world_size') or '?'}"
        if run.get("lnc") and str(run.get("device")).startswith("neuron"):
            device += f" lnc{run['lnc']}"
        parent = short_diff(run.get("parent_diff"))
        if run.get("parent_name"):
            parent = f"{run['parent_name']}: {parent}" + (" CONFOUNDED (steps differ >10%)" if run.get("confounded") else "")
        table.add_row(
            escape(run["name"]), escape(str(run.get("recipe"))), _num(run.get("seed"), "d"), escape(parent),
            status if status == COMPLETED else f"[red]{status}[/red]",
            _num(run.get("steps"), ","), _num(run.get("tokens_per_second"), ",.0f"),
            _num(run.get("charged_seconds"), ",.1f"), _num(run.get("val_bpb"), ".6f"),
            describe_setting(run["score"]) if run.get("score") else "-", _projected(run), _num(run.get("core"), ".4f"), commit, device,
            _short(run.get("prepare_sha256")),
        )  # fmt: skip
    console.print(table)
    console.print(fits_line)


@app.callback()
def list_command(
    ctx: typer.Context,
    name: str | None = typer.Option(None, "--name", help="Run names matching this glob."),
    recipe: str | None = typer.Option(None, "--recipe", help="Runs of recipes whose name matches this glob."),
    status: str | None = typer.Option(None, "--status", help="completed, diverged, crashed, incomplete."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, neuron (a glob)."),
    seed: int | None = typer.Option(None, "--seed", help="Runs with this runtime.seed."),
    commit: str | None = typer.Option(None, "--commit", help="Runs whose git commit starts with this."),
    sort: str = typer.Option("created", "--sort", help="Column to sort by (val_bpb, tokens_per_second, ...); -COLUMN descends."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="At most this many rows."),
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """List the runs in the ledger ($TRNF_HOME/ledger.sqlite, or $TRNF_LEDGER) with their
    scores and projected official scores. A lost ledger is rebuilt from runs/."""
    if ctx.invoked_subcommand is not None:
        return
    from trnfrontier.ledger import official
    from trnfrontier.ledger.listing import Filters, select
    from trnfrontier.ledger.record import load_runs

    runs = load_runs(note=_note)
    filters = Filters(name=name, recipe=recipe, status=status, device=device, seed=seed, commit=commit)
    chosen = select(runs, filters, sort=sort, limit=limit)
    fits = official.fit_offsets(runs)
    if json_output:
        print_json({"runs": chosen, "official_fits": [fit.to_json() for fit in fits.values()]})
        return
    render_list(chosen, _fits_line(fits), out())


def _fits_line(fits: dict[Any, Any]) -> str:
    from trnfrontier.ledger import official

    if not fits:
        return official.no_pairs_line()
    lines = []
    for fit in fits.values():
        spread = "uncertainty unknown from one pair" if fit.sd is None else f"± {fit.prediction_half_width:.4f} for a new run"
        tokens = f"{fit.num_tokens:,}" if isinstance(fit.num_tokens, int) else "?"
        lines.append(
            f"official = local {fit.offset:+.4f} ({spread}; {fit.n} pair{'s' if fit.n != 1 else ''} at {tokens} tokens, seq_len {fit.seq_len})"
        )
    return "\n".join(lines)


@app.command("show")
def show_command(
    run: str = typer.Argument(..., help="Run name or run directory."),
    against: str | None = typer.Option(None, "--against", help="Diff the recipe against this run instead of the parent."),
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Everything the ledger holds about one run: provenance, environment, every score,
    official scores, and its recipe's difference from its parent (or --against RUN)."""
    from trnfrontier.ledger import official
    from trnfrontier.ledger.listing import annotate
    from trnfrontier.ledger.reader import recipe_diff
    from trnfrontier.ledger.record import find_run, load_runs

    runs = load_runs(note=_note)
    chosen = find_run(runs, run)
    annotated = next(r for r in annotate([*runs, chosen] if chosen not in runs else runs) if r["run_dir"] == chosen["run_dir"])
    if against is not None:
        other = find_run(runs, against)
        annotated["parent_name"] = other["name"]
        annotated["parent_diff"] = recipe_diff(other["recipe_json"], chosen["recipe_json"])
    if json_output:
        print_json(annotated)
        return
    console = out()
    keep_wide(console, 160)  # hashes and paths print whole when piped
    keys = ("run_dir", "recipe", "recipe_ref", "overrides", "seed", "status", "steps", "tokens", "tokens_per_second",
            "charged_seconds", "params", "device", "world_size", "lnc", "git_commit", "git_dirty", "git_repo",
            "prepare_sha256", "tokenizer_sha256", "dataset", "data_id", "env")  # fmt: skip
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for key in keys:
        grid.add_row(key, escape(str(annotated.get(key))))
    parent = annotated.get("parent_name") or "-"
    diff = annotated.get("parent_diff") or {}
    grid.add_row("parent", escape(parent))
    for key, (old, new) in diff.items():
        grid.add_row("", escape(f"{key}: {old} -> {new}"))
    console.print(grid)
    fits = official.fit_offsets(runs)
    for score in annotated["scores"]:
        projected = official.project(score, fits)
        shown = "" if projected is None else f"; projected official {_projected({'projected': projected})}"
        console.print(
            f"score ({score['source']}): val_bpb {score['val_bpb']:.6f} on {score.get('split')}, "
            f"{_num(score.get('num_tokens'), ',')} tokens, seq_len {score.get('seq_len')}, status {score.get('status')}{shown}"
        )
        if isinstance(score.get("core"), (int, float)):
            from trnfrontier.ledger.scores import describe_core_setting

            console.print(f"  CORE {score['core']:.4f} ({describe_core_setting(score)})")
    for pair in annotated["official"]:
        console.print(f"official: {pair['official']:.6f} (local then {pair['local_val_bpb']:.6f}){' - ' + escape(pair['note']) if pair.get('note') else ''}")
    if not fits:
        console.print(official.no_pairs_line())


@app.command("score")
def score_command(
    pool: Path = typer.Option(..., "--pool", help="The finalists' entries: JSON [{name, val_bpb, core}, ...] or CSV name,val_bpb,core."),
    name: str | None = typer.Option(None, "--name", help="Local runs whose names match this glob."),
    json_output: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Phase 2's combined score of each local run against the finalists' pool: val_bpb and
    CORE min-max normalised over the pool and the run (lower bpb, higher CORE better), half
    each, and the run's rank among them."""
    from trnfrontier.ledger import combined
    from trnfrontier.ledger.listing import Filters, select
    from trnfrontier.ledger.record import load_runs

    entries = combined.read_pool(pool)
    runs, notes = combined.local_entries(select(load_runs(note=_note), Filters(name=name), sort="created", limit=None))
    placed = combined.score_runs(runs, entries)
    if json_output:
        print_json({"pool": str(pool), "pool_entries": len(entries), "runs": [p.to_json() for p in placed], "notes": notes})
        return
    table = Table(title=f"Phase 2 combined score against {len(entries)} pool entries ({pool})")
    for column in ("run", "val_bpb", "CORE", "bpb (norm.)", "CORE (norm.)", "combined", "rank"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for p in placed:
        table.add_row(escape(p.name), f"{p.values['val_bpb']:.6f}", f"{p.values['core']:.4f}", f"{p.normalised['val_bpb']:.3f}",
                      f"{p.normalised['core']:.3f}", f"{p.combined:.3f}", f"{p.rank} of {p.of}")
    out().print(table)
    for line in notes:
        _note(line)
    if not placed:
        _note("no local run has both val_bpb and CORE: score one with `trnf eval RUN --core`")


@app.command("rebuild")
def rebuild_command(
    roots: list[Path] | None = typer.Argument(None, help="Folders holding run directories (default: runs)."),
) -> None:
    """Rebuild the ledger from run directories (their recipe.json, summary.json,
    provenance.json, scores.jsonl and official.jsonl); replaces it in one step."""
    from trnfrontier.ledger.record import DEFAULT_ROOTS, rebuild
    from trnfrontier.ledger.store import ledger_path

    chosen = list(roots or DEFAULT_ROOTS)
    count = rebuild(chosen)
    out().print(f"ledger {ledger_path()}: {count} run{'s' if count != 1 else ''} from {', '.join(map(str, chosen))}")


@app.command("record-official")
def record_official_command(
    run: str = typer.Argument(..., help="Run name or directory that was uploaded."),
    score: float = typer.Argument(..., help="The val_bpb the leaderboard gave it."),
    note: str | None = typer.Option(None, "--note", help="Free text kept with the pair (the upload's date, say)."),
) -> None:
    """Pair an uploaded run's official score with its local one; the ledger then projects
    every local score onto the leaderboard."""
    from trnfrontier.ledger import official
    from trnfrontier.ledger.record import load_runs, record_official

    line = record_official(load_runs(note=_note), run, score, note)
    fits = official.fit_offsets(load_runs())
    out().print(
        f"recorded: official {line['official']:.6f}, local {line['local_val_bpb']:.6f} "
        f"(difference {line['official'] - line['local_val_bpb']:+.6f})"
    )
    out().print(_fits_line(fits))


@app.command("set-parent")
def set_parent_command(
    run: str = typer.Argument(..., help="Run name or directory."),
    parent: str | None = typer.Argument(None, help="The run it varies (omit to clear)."),
) -> None:
    """Choose the run a run's recipe is diffed against (by default: the latest earlier run
    of the same recipe name, preferring one without overrides)."""
    from trnfrontier.ledger.record import load_runs, set_parent

    chosen = set_parent(load_runs(note=_note), run, parent)
    out().print(f"{run}: parent {chosen['name'] if chosen else 'none'}")


@app.command("plot")
def plot_command(
    runs: list[str] | None = typer.Argument(None, help="Runs whose loss curves to draw on one chart."),
    output: Path = typer.Option(Path("runs.png"), "--out", "-o", help="PNG file to write."),
    speed: bool = typer.Option(False, "--speed", help="Instead: val_bpb against tokens/s for every scored run."),
    x: str = typer.Option("tokens", "--x", help="Loss-curve x axis: tokens, step or charged_seconds."),
) -> None:
    """Loss curves of several runs on one chart, or (--speed) score against throughput
    across the ledger."""
    from trnfrontier import plots
    from trnfrontier.errors import UsageError
    from trnfrontier.ledger.listing import annotate
    from trnfrontier.ledger.reader import metrics
    from trnfrontier.ledger.record import find_run, load_runs

    ledger_runs = load_runs(note=_note)
    if speed:
        if runs:
            raise UsageError("--speed draws every scored run; give no RUN names with it")
        written = plots.score_vs_speed(annotate(ledger_runs), output)
    else:
        if not runs:
            raise UsageError("give the runs to draw (`trnf runs plot A B`), or --speed for score against tokens/s")
        if x not in ("tokens", "step", "charged_seconds"):
            raise UsageError(f"--x {x}: one of tokens, step, charged_seconds")
        chosen = [find_run(ledger_runs, ref) for ref in runs]
        written = plots.loss_curves([(r["name"], metrics(Path(r["run_dir"]))) for r in chosen], output, x=x)
    out().print(f"wrote {written}")


@app.command("table")
def table_command(
    by: str = typer.Option(..., "--by", help="The key whose settings are the rows: a recipe key (optim.matrix_lr) or a sweep parameter."),
    output_format: str = typer.Option("md", "--format", help="md, latex or csv."),
    baseline: str | None = typer.Option(None, "--baseline", help="The setting the others are compared with (default: the first)."),
    sweep: str | None = typer.Option(None, "--sweep", help="Only the trials of this sweep (its id; a glob)."),
    name: str | None = typer.Option(None, "--name", help="Run names matching this glob."),
    recipe: str | None = typer.Option(None, "--recipe", help="Runs of recipes whose name matches this glob."),
    confidence: float = typer.Option(0.95, "--confidence", min=0.5, max=0.999, help="Confidence level of the intervals."),
    json_output: bool = typer.Option(False, "--json", help="The table as one JSON document instead."),
) -> None:
    """The ablation table: completed runs grouped by one key, each setting's mean val_bpb,
    spread and confidence interval, and its difference from a baseline setting (Welch's
    test); CONFOUNDED where step counts differ by more than 10%. Notes under the table
    name the other keys a row pools and the runs it leaves out (stopped, failed)."""
    import fnmatch

    from trnfrontier.ledger import ablation
    from trnfrontier.ledger.listing import Filters, select
    from trnfrontier.ledger.record import load_runs

    if output_format not in ablation.FORMATS:
        from trnfrontier.errors import UsageError

        raise UsageError(f"--format {output_format}: one of {', '.join(ablation.FORMATS)}")
    # Every status: the runs that did not complete are counted as left out, per setting.
    chosen = select(load_runs(note=_note), Filters(name=name, recipe=recipe))
    if sweep is not None:
        chosen = [r for r in chosen if r.get("sweep") and fnmatch.fnmatchcase(r["sweep"], sweep)]
    document = ablation.build(chosen, by, baseline, confidence)
    if json_output:
        print_json(document)
        return
    typer.echo(ablation.render(document, output_format), nl=False)
