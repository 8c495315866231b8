"""`trnf eval PATH [PATH ...]`: the trusted evaluate_bpb, in a fresh process per checkpoint."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from trnfrontier.console import err, keep_wide, out, print_json
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.progress import steps


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "-"


def _checks(result: dict[str, Any]) -> str:
    if result["status"] == "error":
        return "-"
    causal = (result.get("causality") or {}).get("passed")
    batch = (result.get("batch_independence") or {}).get("passed")
    if causal and batch:
        return "yes"
    failed = [name for name, ok in (("causality", causal), ("batch", batch)) if not ok]
    return "[bold red]NO: " + ", ".join(failed) + "[/bold red]"


def _tokens(result: dict[str, Any]) -> str:
    """The tokens asked for and, when fewer were scored (the split ran out), how many were."""
    requested, scored = result["tokens_requested"], result.get("num_tokens")
    asked = f"{requested:,} tokens ({result['tokens_source']})"
    if isinstance(scored, int) and scored < requested and not result.get("eval_over_timeout"):
        return f"{scored:,} tokens scored of the {asked} requested: the validation split holds no more"
    return asked


def render(document: dict[str, Any], console: Console) -> None:
    """The table, sorted by val_bpb, with the delta to the best valid score."""
    results = document["results"]
    keep_wide(console, 200)
    table = Table(title=f"trusted evaluate_bpb on {document['split']} (prepare.py {document['prepare_path']})")
    for column in ("path", "val_bpb", "Δ best", "tokens", "bytes", "params", "eval s", "causal", "prepare.py SHA256", "tokenizer SHA256"):
        table.add_column(column, justify="left" if column in ("path", "causal") or "SHA" in column else "right")
    for r in results:
        value = r.get("val_bpb")
        if r["status"] == "error":
            shown = "[bold red]ERROR[/bold red]"
        elif r["status"] == "invalid":
            number = f"{value:.6f}" if isinstance(value, (int, float)) and math.isfinite(value) else "nan"
            shown = f"[bold red]INVALID ({number})[/bold red]"
        else:
            shown = f"[bold]{value:.6f}[/bold]"
        delta = r.get("delta_to_best")
        eval_s = f"{r['eval_seconds']:.1f}" if r.get("eval_seconds") is not None else "-"
        if r.get("eval_over_timeout"):
            eval_s += " [bold red](timeout)[/bold red]"
        table.add_row(
            r["path"],
            shown,
            f"{delta:+.6f}" if delta is not None and r["status"] != "error" else "-",
            f"{r['num_tokens']:,}" if r.get("num_tokens") is not None else "-",
            f"{r['num_bytes']:,}" if r.get("num_bytes") is not None else "-",
            f"{r['params']:,}" if r.get("params") is not None else "-",
            eval_s,
            _checks(r),
            _short(r.get("prepare_sha256")),
            _short(r.get("tokenizer_sha256")),
        )
    console.print(table)
    for r in results:
        settings = f"seq_len {r['seq_len']} ({r['seq_len_source']}), {_tokens(r)}, batch {r['batch_size']}"
        line = f"{r['path']}: {settings}"
        if r.get("device"):
            line += f", device {r['device']}, {r.get('dtype', '?')}"
        console.print(line)
        if r["status"] != "error":
            checked = r.get("integrity") or "not checked: no manifest records its SHA256 (a kit's own checkpoint)"
            console.print(f"  checkpoint files: {checked}")
        if r.get("recorded_val_bpb") is not None and r["status"] == "ok":
            same = "equal" if r.get("matches_recorded") else "[bold red]DIFFERENT[/bold red]"
            console.print(f"  trainer recorded val_bpb {r['recorded_val_bpb']:.6f}: {same}")
        for warning in r.get("mismatches") or []:
            console.print(f"  [yellow]--allow-mismatch: {warning}[/yellow]")
        for reason in r["reasons"]:
            style = "bold red" if r["status"] != "ok" else ""
            console.print(f"  [{style}]{r['status'].upper()}: {reason}[/{style}]" if style else f"  {reason}")
        for sample in r.get("samples") or []:
            kind = "greedy" if sample["temperature"] == 0 else f"temperature {sample['temperature']:g}"
            console.print(f"  sample ({kind}):", style="bold")
            console.print(f"    {sample['text']!r}")


def command(
    paths: list[Path] | None = typer.Argument(None, help="Run directories, checkpoint directories or files (final.pt, model.safetensors)."),
    tokens: str | None = typer.Option(None, "--tokens", help="public (2,097,152), official (20,971,520) or a count; default: as the run recorded, else public."),
    seq_len: int | None = typer.Option(None, "--seq-len", min=1, help="Evaluation context; default: as the run recorded, else the contract's EVAL_SEQ_LEN."),
    batch_size: int | None = typer.Option(None, "--batch-size", min=1, help="Rows per forward; default: as the run recorded, else 8."),
    device: str = typer.Option("auto", "--device", help="cpu, cuda, neuron or auto."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON document instead of the table."),
    sample: int = typer.Option(0, "--sample", min=0, help="Also generate N tokens from --prompt, greedy and at --temperature."),
    prompt: str = typer.Option("", "--prompt", help="Text the samples continue (after BOS)."),
    temperature: float = typer.Option(0.8, "--temperature", min=0.0, help="Temperature of the second sample."),
    allow_mismatch: bool = typer.Option(False, "--allow-mismatch", help="Score a checkpoint whose prepare.py / tokenizer SHA256 differs from the current ones."),
    timeout: float | None = typer.Option(None, "--timeout", min=1.0, help="Evaluation timeout in seconds (default: the contract's EVAL_TIMEOUT_SECONDS)."),
    train_py: Path | None = typer.Option(None, "--train-py", help="A kit-style train.py: its load_for_eval(checkpoint, device) loads the model."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", help="The checkpoint --train-py's load_for_eval reads."),
    core: bool = typer.Option(False, "--core", help="Also score CORE, nanochat's capability metric (half the Phase 2 score), on --bundle."),
    bundle: str | None = typer.Option(None, "--bundle", help="CORE bundle: a folder, a zip, an http(s) URL of the zip, a pin file (bundle: + sha256:), or 'sample' (the offline format sample; its score means nothing). Default: $TRNF_CORE_BUNDLE."),
    bundle_sha256: str | None = typer.Option(None, "--bundle-sha256", help="The bundle's pinned SHA256 (the organisers publish it); a mismatch is refused."),
    max_per_task: int | None = typer.Option(None, "--max-per-task", min=1, help="CORE on at most N items per task, for a quick look: NOT the full metric."),
    core_batch_tokens: int | None = typer.Option(None, "--core-batch-tokens", min=1, help="CORE's padded tokens per forward (default 8192); lower it when the device runs out of memory. Verdicts do not change."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Processes per checkpoint (torchrun): they share CORE's items and the validation rows."),
) -> None:
    """Score checkpoints with the trusted evaluate_bpb, each in a fresh process, after the
    causality and batch-independence checks; several paths are sorted by val_bpb. With
    --core, also nanochat's CORE, item for item as nanochat scores it."""
    from trnfrontier.evaluate.core.job import core_from_flags
    from trnfrontier.evaluate.library import EvalOptions, Target, evaluate

    if (train_py is None) != (checkpoint is None):
        raise UsageError("--train-py and --checkpoint go together: trnf eval --train-py train.py --checkpoint out/final.pt")
    if prompt and not sample:
        raise UsageError("--prompt needs --sample N (tokens to generate)")
    targets = [Target(path) for path in paths or []]
    if train_py is not None and checkpoint is not None:
        targets.append(Target(checkpoint, train_py=train_py))
    options = EvalOptions(
        tokens=tokens,
        seq_len=seq_len,
        batch_size=batch_size,
        device=device,
        timeout=timeout,
        allow_mismatch=allow_mismatch,
        sample_tokens=sample,
        prompt=prompt,
        temperature=temperature,
        nproc=nproc,
        core=core_from_flags(core, bundle, bundle_sha256, max_per_task, batch_tokens=core_batch_tokens),
    )
    notes = err()
    what = f"scoring {len(targets)} checkpoint(s) with the trusted evaluate_bpb" + (" and CORE" if core else "")
    per_target = 1 + (options.core.items if options.core else 0)
    with steps(what, len(targets) * per_target, announce=False) as bar:
        document = evaluate(targets, options, progress=bar)
    from trnfrontier.ledger.record import record_eval

    record_eval(document, warn=lambda line: notes.print(line, style="yellow"))
    results = document["results"]
    if len(results) == 1 and results[0]["status"] == "error":
        path, error = results[0]["path"], results[0]["error"]
        # A message that starts with the file it is about needs no prefix naming it again.
        raise TrnfError(error if error.startswith(results[0]["checkpoint"]) else f"{path}: {error}")
    if json_output:
        print_json(document)
    else:
        render(document, out())
        from trnfrontier.cli.eval_core_view import render_core

        render_core(document, out())
    failed = [r for r in results if r["status"] != "ok"]
    for r in failed:
        notes.print(f"[bold red]trnf: {r['status'].upper()}[/bold red]: {r['path']}: {'; '.join(r['reasons'])}")
    if failed:
        raise typer.Exit(1)
