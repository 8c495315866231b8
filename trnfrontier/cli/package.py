"""`trnf package`: a run (or a team's own train.py) -> a reproducible, verifiable submission.tar."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from trnfrontier.cli import modes
from trnfrontier.cli.modes import check_mode
from trnfrontier.console import out, print_json
from trnfrontier.errors import UsageError
from trnfrontier.hints import trnf_line

if TYPE_CHECKING:  # the packaging library imports torch; the command imports it when it runs
    from trnfrontier.packaging.build import PackageResult


def _report(result: PackageResult, json_output: bool) -> None:
    if json_output:
        print_json(result.to_json())
        return
    claimed = result.manifest.get("claimed") or {}
    console = out()
    console.print(
        f"wrote {result.archive} ({result.size:,} bytes, {len(result.manifest['files']) + 1} members)"
    )
    console.print(
        f"claimed val_bpb: {claimed.get('val_bpb', 'none')}; params {result.manifest.get('params'):,}; launch: {result.manifest.get('launch')}"
    )
    for reason in result.manifest.get("forced", []):
        console.print(f"[yellow]forced[/]: {reason}")
    console.print(f"next: {trnf_line('verify', str(result.archive))}")


def command(
    run_dir: Path | None = typer.Argument(
        None, help="The run directory to package (runs/<name>). Omit with --train-py."
    ),
    output: Path = typer.Option(
        Path("submission.tar"), "-o", "--output", help="The archive to write (atomically)."
    ),
    writeup: Path | None = typer.Option(
        None,
        "--writeup",
        help="Your WRITEUP text; generated facts go at <!-- trnf:facts --> or after it.",
    ),
    single_file: bool = typer.Option(
        False,
        "--single-file",
        help="Inline the runtime into train.py (one code file, under the portal's size limit).",
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Package despite refusals (over budget, diverged, pins, screen); recorded in the manifest and write-up.",
    ),
    json_output: bool = typer.Option(
        False, "--json", help="Print the result as one JSON document."
    ),
    pins: Path | None = typer.Option(None, "--pins", help="JSON pins file (as for trnf verify)."),
    train_py: Path | None = typer.Option(
        None,
        "--train-py",
        help="Kit mode: your own train.py, shipped as-is with the .py files it imports from its directory.",
    ),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="Kit mode: the checkpoint your train.py wrote (out/final.pt)."
    ),
    launch: str | None = typer.Option(
        None,
        "--launch",
        help='The launch line, e.g. "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 train.py": '
        "required in kit mode; for a run directory, the shape the organisers will run when the run rehearsed at another "
        "scale (checked against the run's phase).",
    ),
    kit_run_dir: Path | None = typer.Option(
        None,
        "--run-dir",
        help="Kit mode: the run directory of `trnf train --train-py` (logs, summary, measured val_bpb).",
    ),
    val_bpb_from_eval: bool = typer.Option(
        False,
        "--val-bpb-from-eval",
        help="Kit mode: measure val_bpb now with the trusted evaluate_bpb (trnf eval).",
    ),
    phase: int | None = typer.Option(
        None,
        "--phase",
        min=1,
        max=2,
        help="Kit mode: the competition phase (2 ships the inference.py beside train.py); default: the phase the "
        "--run-dir run recorded (`trnf train --train-py --phase`), else 1. A run directory's recipe says its own.",
    ),
) -> int:
    """Package a run (or, with --train-py, your own train.py) as submission.tar."""
    from trnfrontier.packaging.finished_run import recorded_phase  # reads JSON only: no torch

    given = {
        "RUN_DIR": run_dir is not None,
        "--single-file": single_file,
        "--checkpoint": checkpoint is not None,
        # A Phase 2 run directory may name the server's launch (it rehearsed at another scale).
        "--launch": launch is not None and not (train_py is None and (recorded_phase(run_dir) or 1) != 1),
        "--run-dir": kit_run_dir is not None,
        "--val-bpb-from-eval": val_bpb_from_eval,
        "--phase": phase is not None,
    }
    check_mode(modes.PACKAGE, "kit" if train_py is not None else "recipe", given)
    from trnfrontier.progress import steps

    if train_py is not None:
        from trnfrontier.packaging.kit import package_kit

        # A spinner with the elapsed time: hashing and screening a large checkpoint takes a while.
        with steps(f"packaging {train_py}", None, enabled=not json_output):
            result = package_kit(
                train_py,
                checkpoint,
                launch,
                output,
                run_dir=kit_run_dir,
                writeup=writeup,
                force=force,
                pins_file=pins,
                val_bpb_from_eval=val_bpb_from_eval,
                phase=phase,
            )
    else:
        if run_dir is None:
            raise UsageError(
                "give a RUN_DIR to package, or --train-py with --checkpoint and --launch"
            )
        from trnfrontier.packaging.build import package_run
        from trnfrontier.packaging.finished_run import read_run

        run = read_run(run_dir)  # refused before "packaging ..." claims to start
        with steps(f"packaging {run_dir}", None, enabled=not json_output):
            result = package_run(
                run, output, writeup=writeup, single_file=single_file, force=force, pins_file=pins, launch=launch
            )
    _report(result, json_output)
    return 0
