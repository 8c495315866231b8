"""`trnf verify ARCHIVE`: every check the organisers' gate would run, before an upload is spent."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from trnfrontier.console import out, print_json
from trnfrontier.errors import TrnfError, UsageError

if TYPE_CHECKING:  # the verify library (numpy, the sandbox) loads when the command runs
    from trnfrontier.verify import Report

_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow"}


def _table(report: Report) -> Table:
    table = Table(title=f"trnf verify {report.archive}", title_justify="left")
    table.add_column("check")
    table.add_column("verdict")
    table.add_column("reason", overflow="fold")
    for check in report.checks:
        verdict = check.verdict + ("" if check.required or check.verdict == "pass" else " (optional)")
        # Reasons quote archive text: printed as text, never read as rich markup.
        table.add_row(escape(check.name), f"[{_STYLE[check.verdict]}]{verdict}[/]", escape(check.reason))
    return table


def command(
    archive: Path = typer.Argument(..., help="The submission archive (.tar or .tar.gz)."),
    json_output: bool = typer.Option(False, "--json", help="Print the whole report as one JSON document."),
    rerun_eval: bool = typer.Option(False, "--rerun-eval", help="Recompute val_bpb with the trusted evaluate_bpb and compare with the claim."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Run train.py for a few CPU steps in a clean environment with only the organisers' packages."),
    pins: Path | None = typer.Option(None, "--pins", help="JSON file with prepare_sha256 / tokenizer_sha256 (default $TRNF_HOME/pins.json, else the selected prepare.py and active tokenizer)."),
    timeout: float | None = typer.Option(None, "--timeout", min=1.0, help="Seconds allowed for each subprocess (default: contract 300, re-eval 1500, dry run 900)."),
    steps: int = typer.Option(3, "--dry-run-steps", min=1, help="Steps for --dry-run (passed as TRNF_DRY_RUN_STEPS)."),
    allow_unsandboxed: bool = typer.Option(False, "--allow-unsandboxed", help="Where bubblewrap is unavailable, run archive code anyway, without isolation (the report's first line says so)."),
    core_bundle: str = typer.Option("sample", "--core-bundle", help="Phase 2: the CORE bundle a few items of which run through inference.py (a folder, zip, URL or pin file; default the shipped format sample) for the consistency check and the CORE time projection."),
    core: bool = typer.Option(False, "--core", help="Also score CORE on the archive's model (served from the sandbox) on --core-bundle, as trnf eval --core does."),
    core_bundle_sha256: str | None = typer.Option(None, "--core-bundle-sha256", help="With --core: the bundle's pinned SHA256."),
    max_per_task: int | None = typer.Option(None, "--max-per-task", min=1, help="With --core: at most N items per task, NOT the full metric."),
    eval_tokens: int | None = typer.Option(None, "--eval-tokens", min=1, help="Tokens --rerun-eval scores (default: the contract's public count, 2,097,152); the claim must have been measured on as many."),
    eval_seq_len: int | None = typer.Option(None, "--eval-seq-len", min=1, help="Sequence length --rerun-eval scores at (default: the contract's, 1024); the claim must have been measured at it."),
) -> int:
    """Check a submission archive; exit 0 only if every required check passes."""
    if archive.is_dir():
        raise UsageError(f"{archive}: is a directory; give the path of a submission archive (trnf package writes one)")
    if not archive.is_file():
        raise UsageError(f"{archive}: no such file; give the path of a submission archive")
    from trnfrontier.contract.pins import check_pins_file
    from trnfrontier.verify.filetype import not_an_archive

    check_pins_file(pins)  # usage errors before what the archive holds
    what = None if json_output else not_an_archive(archive)
    if what is not None:  # the one line that matters, not a table of checks that never ran
        raise TrnfError(
            f"{archive} is not a submission archive: it is {what}; trnf verify takes the tar archive "
            "`trnf package` writes (plain, or gzip, bzip2 or xz compressed)"
        )
    from trnfrontier.evaluate.core.job import core_from_flags
    from trnfrontier.verify import Options, verify_archive

    options = Options(rerun_eval=rerun_eval, dry_run=dry_run, pins_file=pins, timeout=timeout, dry_run_steps=steps,
                      allow_unsandboxed=allow_unsandboxed, core_bundle=core_bundle,
                      core=core_from_flags(core, core_bundle if core else None, core_bundle_sha256, max_per_task,
                                           ("--core-bundle", "--core-bundle-sha256", "--max-per-task")),
                      eval_tokens=eval_tokens, eval_seq_len=eval_seq_len)
    from trnfrontier.progress import steps as progress_steps
    from trnfrontier.verify.runner import progress_units

    with progress_steps(f"verifying {archive}", progress_units(options)) as bar:
        report = verify_archive(archive, options, progress=bar)
    if json_output:
        print_json(report.to_json())
    else:
        console = out()
        style = "green" if report.sandbox.startswith("sandbox:") else "bold red"
        console.print(f"[{style}]{escape(report.sandbox)}[/]")
        console.print(_table(report))
        for note in report.notes:
            console.print(f"note: {escape(note)}")
        if report.core is not None:
            from trnfrontier.cli.eval_core_view import render_core

            render_core({"results": [{"path": str(archive), "core": report.core, "device": "cpu"}]}, console)
        failed = [c.name for c in report.checks if c.verdict == "fail"]
        unchecked = sum(1 for c in report.checks if not c.ok and c.verdict == "skip")
        tail = f" ({unchecked} required check(s) not run)" if unchecked else ""
        console.print("[green]PASS[/]: every required check passed" if report.ok else f"[bold red]FAIL[/]: {', '.join(failed)}{tail}")
    return report.exit_code
