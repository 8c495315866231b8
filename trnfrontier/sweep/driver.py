"""The library behind `trnf sweep`: start a sweep in a new folder, or resume one, run it
on Ray to its end, and leave its report (table rows, best recipe, figure) behind.

One driver per sweep folder (``writer.lock``, as for a run directory). Stopping the
driver (Ctrl-C, ``kill``, even ``kill -9``) ends its trials with it; `trnf sweep --resume
DIR` then continues: finished trials are not repeated, interrupted ones resume from their
checkpoints.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trnfrontier.contract.kit import OUT_DIR_ENV
from trnfrontier.errors import TrnfError
from trnfrontier.runtime import runlock
from trnfrontier.sweep import engine, report
from trnfrontier.sweep import state as st
from trnfrontier.sweep.spec import SweepSpec, read_spec

RUNS_DIR = Path("runs")


@dataclass
class Outcome:
    """What the CLI shows when a sweep ends (or is looked at)."""

    sweep: st.SweepState
    spec: SweepSpec
    rows: list[dict[str, Any]]
    best_recipe: Path | None = None
    figure: Path | None = None
    progress: str | None = None  # `trnf sweep status`: the live view's counts line


def new_folder(spec: SweepSpec, out: Path | None) -> Path:
    folder = out if out is not None else RUNS_DIR / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = folder.expanduser()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise TrnfError(
            f"{folder} already exists; give another --out, or continue the sweep there with `trnf sweep --resume {folder}`",
            exit_code=2,
        )
    return folder


def _portable(spec: SweepSpec) -> dict[str, Any]:
    """The spec as the sweep keeps it (spec.yaml): a recipe or script named by a path
    relative to here is made absolute, so --resume finds it from anywhere."""
    document = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    for key in ("recipe", "train_py"):
        value = document.get(key)
        if value and Path(value).expanduser().is_file():
            document[key] = str(Path(value).expanduser().resolve())
    return document


def check_environment(spec: SweepSpec, environ: Mapping[str, str] | None = None) -> None:
    """A kit sweep's trials each write into their own run directory, through the kit's
    NEURON_COMPETITION_R1_OUT_DIR, unless the user set it: then trials running at once
    would share that one folder."""
    source = os.environ if environ is None else environ
    if spec.train_py is not None and spec.concurrency > 1 and source.get(OUT_DIR_ENV):
        raise TrnfError(
            f"{OUT_DIR_ENV} is set ({source[OUT_DIR_ENV]}): every trial of this sweep, {spec.concurrency} at once, would "
            f"write its checkpoint there; unset it (trnf gives each trial its own folder) or set concurrency: 1",
            exit_code=2,
        )


def start(spec_path: Path, out: Path | None, address: str | None, say: engine.Say) -> Outcome:
    """Validate the spec, make the sweep's folder, run every trial."""
    spec = read_spec(spec_path)
    check_environment(spec)
    engine.import_tune()  # a missing Ray is said before any folder is made
    folder = new_folder(spec, out)
    folder.mkdir(parents=True, exist_ok=True)
    document = _portable(spec)
    (folder / st.SPEC_FILE).write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    sweep = st.new_state(folder, spec.name, document)
    sweep.save()
    say(f"sweep {sweep.sweep_id}: {spec.expected_trials()} trials, {spec.concurrency} at a time, in {folder}")
    return _run_locked(sweep, spec, address, resume=False, say=say)


def resume(folder: Path, address: str | None, say: engine.Say) -> Outcome:
    """Continue the sweep in ``folder`` with the spec it started with."""
    sweep = st.load_state(folder)
    spec = read_spec(folder / st.SPEC_FILE)
    check_environment(spec)
    engine.import_tune()
    sweep.resumes += 1
    sweep.finished = None
    sweep.save()
    done = sweep.counts()
    say(f"resuming sweep {sweep.sweep_id}: {done[st.COMPLETED]} completed, {done[st.STOPPED]} stopped, "
        f"{done[st.FAILED]} failed so far")  # fmt: skip
    return _run_locked(sweep, spec, address, resume=True, say=say)


def _run_locked(sweep: st.SweepState, spec: SweepSpec, address: str | None, resume: bool, say: engine.Say) -> Outcome:
    try:
        lock = runlock.acquire(sweep.folder, command="trnf sweep")
    except runlock.RunLockedError as exc:
        raise TrnfError(str(exc).replace("logs and checkpoints", "trials")) from None
    try:
        try:
            engine.run(sweep, spec, address, resume, say)
        except KeyboardInterrupt:
            say(f"sweep stopped; continue it with `trnf sweep --resume {sweep.folder}`")
            raise
        sweep = st.load_state(sweep.folder)
        _close_open_trials(sweep)
        sweep.finished = time.time()
        sweep.save()
    finally:
        lock.release()
    return finish(sweep, spec)


def _close_open_trials(sweep: st.SweepState) -> None:
    """A trial Tune ended without an event (the sweep stopped around it) is not running."""
    for trial in sweep.trials.values():
        if trial.get("status") == st.RUNNING:
            trial["status"] = "interrupted"


def finish(sweep: st.SweepState, spec: SweepSpec) -> Outcome:
    found = report.rows(sweep, spec)
    return Outcome(
        sweep, spec, found,
        best_recipe=report.write_best_recipe(sweep, found, spec.metric),
        figure=report.write_figure(sweep, spec, found),
    )  # fmt: skip


def status(folder: Path) -> Outcome:
    """The sweep in ``folder`` as it stands (in flight or finished); writes nothing."""
    sweep = st.load_state(folder)
    spec = read_spec(folder / st.SPEC_FILE)
    alive = st.driver_alive(folder)
    return Outcome(sweep, spec, report.rows(sweep, spec, driver_alive=alive),
                   progress=report.progress_line(sweep, spec, alive=alive))  # fmt: skip
