"""``sweep.json``: the sweep's own record, beside its trials' run directories.

Layout of a sweep folder (default ``runs/<name>-<date>/``)::

    sweep.json          this record: id, spec, trials (parameters, run dir, status, error)
    spec.yaml           the spec as given (what --resume reads)
    writer.lock         the live driver (one per sweep folder: runtime.runlock)
    <name>-<trial>/     one ordinary run directory per trial (`trnf train --out`)
    logs/<trial>.log    each trial's `trnf train` console output
    .tune/              Ray Tune's experiment state (what resumes the search itself)
    best_recipe.yaml, sweep.png   written when the sweep ends

Written only by the driver, always atomically (a kill leaves the previous version whole).
What a trial *scored* is never stored here: the report reads it from the run directory.
Statuses: pending, running, completed, stopped (ASHA ended it early), failed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnfrontier.errors import TrnfError
from trnfrontier.runtime.atomic import atomic_write_json

STATE_FILE = "sweep.json"
SPEC_FILE = "spec.yaml"
TUNE_DIR = ".tune"
TUNE_NAME = "tune"
FORMAT = "trnf-sweep/1"
RUNNING, COMPLETED, STOPPED, FAILED = "running", "completed", "stopped", "failed"
ENDED = (COMPLETED, STOPPED, FAILED)


@dataclass
class SweepState:
    folder: Path
    sweep_id: str
    name: str
    spec: dict[str, Any]
    created: float
    trials: dict[str, dict[str, Any]] = field(default_factory=dict)
    finished: float | None = None
    resumes: int = 0
    # When the driver now running (or the last one) started: the time left is reckoned
    # from the trials that ended since, not from those an earlier driver ran.
    driver_started: float | None = None

    @property
    def path(self) -> Path:
        return self.folder / STATE_FILE

    @property
    def tune_path(self) -> Path:
        return self.folder / TUNE_DIR / TUNE_NAME

    def save(self) -> None:
        document = {
            "format": FORMAT,
            "id": self.sweep_id,
            "name": self.name,
            "spec": self.spec,
            "created": self.created,
            "finished": self.finished,
            "resumes": self.resumes,
            "driver": {"pid": os.getpid(), "host": os.uname().nodename, "started": self.driver_started},
            "trials": self.trials,
        }
        atomic_write_json(self.path, document)

    def trial(self, trial_id: str) -> dict[str, Any]:
        return self.trials.setdefault(trial_id, {})

    def update(self, trial_id: str, **values: Any) -> None:
        self.trial(trial_id).update(values)
        self.save()

    def counts(self) -> dict[str, int]:
        counts = {RUNNING: 0, COMPLETED: 0, STOPPED: 0, FAILED: 0}
        for trial in self.trials.values():
            status = trial.get("status")
            if status in counts:
                counts[status] += 1
        return counts


def new_state(folder: Path, name: str, spec: dict[str, Any]) -> SweepState:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return SweepState(folder=folder, sweep_id=f"{name}-{stamp}-{os.urandom(2).hex()}", name=name, spec=spec, created=time.time())


def load_state(folder: Path) -> SweepState:
    """The sweep in ``folder``; a folder that is not a sweep is one clear line."""
    path = folder / STATE_FILE
    if not folder.is_dir():
        raise TrnfError(f"{folder}: no such sweep folder", exit_code=2)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        raise TrnfError(f"{folder} is not a sweep folder (no {STATE_FILE}); give the folder `trnf sweep` made", exit_code=2) from None
    except ValueError as exc:
        raise TrnfError(f"{path} is unreadable ({exc}); the sweep cannot be resumed", exit_code=2) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TrnfError(f"{path} is not a {FORMAT} record", exit_code=2)
    return SweepState(
        folder=folder,
        sweep_id=str(document["id"]),
        name=str(document["name"]),
        spec=dict(document["spec"]),
        created=float(document["created"]),
        trials=dict(document.get("trials") or {}),
        finished=document.get("finished"),
        resumes=int(document.get("resumes") or 0),
        driver_started=(document.get("driver") or {}).get("started"),
    )


def driver_alive(folder: Path) -> bool:
    """True while a driver holds the sweep folder's lock (on this host)."""
    from trnfrontier.runtime import runlock

    try:
        lock = runlock.acquire(folder)
    except runlock.RunLockedError:
        return True
    lock.release()
    return False
