"""WRITEUP.md and loss_curve.png written into a run directory when the run finishes.

The same two files `trnf package` puts in the archive, so a team reads (and edits) the
write-up and sees the curve without packaging first. The team's text above the facts
marker survives a rewrite, and `trnf package` takes it from here when no --writeup is given.
"""

from __future__ import annotations

from pathlib import Path

from trnfrontier import submission as fmt
from trnfrontier.contract.kit import LAUNCH_FILE
from trnfrontier.contract.phases import phase_of
from trnfrontier.errors import TrnfError
from trnfrontier.packaging.build import add_writeup, launch_for, summary_facts, typed_recipe
from trnfrontier.packaging.trainpy import uses_kernels
from trnfrontier.packaging.writeup import existing_team_text
from trnfrontier.runtime.atomic import atomic_write_bytes
from trnfrontier.runtime.rundir import METRICS_FILE, RECIPE_FILE, read_summary


def write_run_report(run_dir: Path) -> list[Path]:
    """Write WRITEUP.md (and loss_curve.png when a loss was logged) into ``run_dir``; the
    paths written. Raises TrnfError when the run has no summary or recipe to describe."""
    import json

    summary = read_summary(run_dir)
    if summary is None:
        raise TrnfError(f"{run_dir}: no summary.json; nothing to write up")
    recipe: dict | None = None
    if (run_dir / RECIPE_FILE).exists():
        try:
            recipe = json.loads((run_dir / RECIPE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TrnfError(f"{run_dir / RECIPE_FILE}: unreadable ({exc}); nothing to write up") from None
    if recipe is not None:
        launch = launch_for(typed_recipe(recipe, run_dir).runtime, phase_of(recipe))
        kernels, source = uses_kernels(recipe), f"run directory {run_dir.name}"
    else:  # a kit run (`trnf train --train-py`): the team's train.py, the launch line it ran with
        try:
            launch = (run_dir / LAUNCH_FILE).read_text(encoding="utf-8").strip()
        except OSError:
            launch = "unknown"
        kernels, source = [], f"kit run {run_dir.name}"
    facts = summary_facts(
        summary, name=str(summary.get("name") or run_dir.name), source=source, launch=launch, kernels=kernels
    )
    members: dict[str, Path | bytes] = {}
    add_writeup(
        members, facts, recipe, run_dir / METRICS_FILE, [], existing_team_text(run_dir), keep_marker=True
    )
    written = []
    for name in (fmt.LOSS_CURVE, fmt.WRITEUP):
        data = members.get(name)
        if isinstance(data, bytes):
            atomic_write_bytes(run_dir / name, data)
            written.append(run_dir / name)
    return written


def report_finished_run(run_dir: Path, *, quiet: bool) -> None:
    """``write_run_report`` at the end of `trnf train`: what it wrote on stderr (unless
    ``quiet``), and a failure (no matplotlib, a full disk) as a note, since the run itself
    is done and its files are whole."""
    from trnfrontier.console import err

    try:
        written = write_run_report(run_dir)
    except (TrnfError, OSError) as exc:
        err().print(f"note: no write-up in {run_dir}: {exc}")
        return
    if not quiet and written:
        err().print("wrote " + " and ".join(str(path) for path in written))
