"""Phase 2's combined score of local runs against the finalists' pool (`trnf runs score`).

The organisers score Phase 2 as the weighted mean of each metric min-max normalised over
the pool of finalists' entries, directions aligned (``contract.phases.PHASES[2]``: 0.5
val_bpb, lower better; 0.5 CORE, higher better). A metric's normalised value is 1 for the
pool's best entry and 0 for its worst:

    lower is better:  (max - x) / (max - min)      higher is better:  (x - min) / (max - min)

A local run is scored as if it joined the pool: the minimum and maximum are taken over the
pool's entries and the run (so a run better than every finalist scores 1 on that metric,
and moves the others), and its rank is among those entries (1 is best). Each run is placed
against the pool alone, never against the other local runs. A metric on which every entry
is equal separates no one: everyone gets 1 on it.

The pool file is the finalists' (val_bpb, CORE) pairs as a team knows them: JSON (a list
of ``{"name", "val_bpb", "core"}`` objects, or ``{"entries": [...]}``) or CSV with the
header ``name,val_bpb,core``. A bad file is one line naming the file and the entry.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnfrontier.contract.phases import CORE, PHASES, VAL_BPB, Phase
from trnfrontier.errors import UsageError

PHASE = PHASES[2]


@dataclass(frozen=True)
class Entry:
    name: str
    values: dict[str, float]  # metric name -> value


@dataclass(frozen=True)
class Placed:
    """A local run placed in the pool."""

    name: str
    values: dict[str, float]
    normalised: dict[str, float]
    combined: float
    rank: int  # 1 is best, among the pool's entries and this run
    of: int  # entries ranked (the pool and this run)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.values, "normalised": self.normalised, "combined": self.combined,
                "rank": self.rank, "of": self.of}


# ---------------------------------------------------------------------------- the pool file


def read_pool(path: Path, phase: Phase = PHASE) -> list[Entry]:
    """The pool's entries from a JSON or CSV file; UsageError naming what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--pool {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    rows = _json_rows(text, path) if text.lstrip()[:1] in ("[", "{") else _csv_rows(text, path)
    if not rows:
        raise UsageError(f"--pool {path}: no entries (give the finalists' name, val_bpb and core)")
    entries = [_entry(row, where, path, phase) for where, row in rows]
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise UsageError(f"--pool {path}: {entry.name!r} appears twice")
        seen.add(entry.name)
    return entries


def _json_rows(text: str, path: Path) -> list[tuple[str, Any]]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise UsageError(f"--pool {path}: not valid JSON ({exc})") from None
    if isinstance(data, dict):
        data = data.get("entries")
    if not isinstance(data, list):
        raise UsageError(f"--pool {path}: expected a list of entries (or {{\"entries\": [...]}})")
    return [(f"entry {i + 1}", row) for i, row in enumerate(data)]


def _csv_rows(text: str, path: Path) -> list[tuple[str, Any]]:
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in reader.fieldnames or []]
    if "name" not in header:
        raise UsageError(f"--pool {path}: neither JSON nor CSV with a header name,{VAL_BPB},{CORE}")
    reader.fieldnames = header
    return [(f"line {reader.line_num}", row) for row in reader]


def _entry(row: Any, where: str, path: Path, phase: Phase) -> Entry:
    if not isinstance(row, dict):
        raise UsageError(f"--pool {path}, {where}: expected an object with name, {VAL_BPB} and {CORE}")
    name = row.get("name")
    if not isinstance(name, str) or not name.strip():
        raise UsageError(f"--pool {path}, {where}: no name")
    values = {}
    for metric in phase.metrics:
        values[metric.name] = _number(row.get(metric.name), f"--pool {path}, {where} ({name}): {metric.name}")
    return Entry(name.strip(), values)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or value is None or value == "":
        raise UsageError(f"{what} is missing")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{what} is {value!r}, not a number") from None
    if not math.isfinite(number):
        raise UsageError(f"{what} is {value!r}, not a finite number")
    return number


# ---------------------------------------------------------------------------- the score


def normalised(value: float, low: float, high: float, higher_is_better: bool) -> float:
    """Min-max normalised, best 1 and worst 0; 1 when the whole range is one value."""
    if high == low:
        return 1.0
    return (value - low) / (high - low) if higher_is_better else (high - value) / (high - low)


def combined_scores(entries: list[Entry], phase: Phase = PHASE) -> list[float]:
    """Each entry's combined score over these entries (the weighted normalised metrics)."""
    totals = [0.0] * len(entries)
    for metric in phase.metrics:
        column = [e.values[metric.name] for e in entries]
        low, high = min(column), max(column)
        for i, value in enumerate(column):
            totals[i] += metric.weight * normalised(value, low, high, metric.higher_is_better)
    return totals


def place(run: Entry, pool: list[Entry], phase: Phase = PHASE) -> Placed:
    """``run``'s normalised metrics, combined score and rank if it joined ``pool``."""
    everyone = [*pool, run]
    scores = combined_scores(everyone, phase)
    mine = scores[-1]
    normal = {}
    for metric in phase.metrics:
        column = [e.values[metric.name] for e in everyone]
        normal[metric.name] = normalised(run.values[metric.name], min(column), max(column), metric.higher_is_better)
    rank = 1 + sum(1 for score in scores[:-1] if score > mine)
    return Placed(run.name, dict(run.values), normal, mine, rank, len(everyone))


def score_runs(runs: list[Entry], pool: list[Entry], phase: Phase = PHASE) -> list[Placed]:
    """Every local run placed against the pool on its own, best first."""
    return sorted((place(run, pool, phase) for run in runs), key=lambda p: (-p.combined, p.name))


# ---------------------------------------------------------------------------- local runs


def local_entries(runs: list[dict[str, Any]]) -> tuple[list[Entry], list[str]]:
    """The ledger's runs that have both a val_bpb and a CORE score, as pool entries, and a
    line for each run left out (and why). A CORE from a subsample (``--max-per-task``) is
    used, and said: it is not the full metric the pool's numbers are."""
    from trnfrontier.ledger import scores

    entries, notes = [], []
    for run in runs:
        bpb, core = scores.primary_score(run), scores.core_score(run)
        if bpb is None or core is None:
            missing = " and ".join(m for m, s in ((VAL_BPB, bpb), (CORE, core)) if s is None)
            notes.append(f"{run['name']}: no {missing} (`trnf eval {run['name']}{' --core' if core is None else ''}`)")
            continue
        if core.get("core_max_per_task"):
            notes.append(f"{run['name']}: CORE from at most {core['core_max_per_task']} items per task, not the full metric")
        entries.append(Entry(str(run["name"]), {VAL_BPB: float(bpb["val_bpb"]), CORE: float(core[CORE])}))
    return entries, notes
