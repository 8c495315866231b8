"""The library behind `trnf runs`: filter, sort and annotate the ledger's runs.

Each listed run carries its primary score (``scores.primary_score``), the projected
official score where pairs were recorded at that score's setting (``official``), and its
recipe's difference from its parent run.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnfrontier.errors import UsageError
from trnfrontier.ledger import confound, official, reader, scores

# What --sort accepts beyond the stored columns.
DERIVED = ("val_bpb", "projected", "core")


@dataclass
class Filters:
    """Command-line filters; None means "any". Text filters are globs."""

    name: str | None = None
    recipe: str | None = None
    status: str | None = None
    device: str | None = None
    seed: int | None = None
    commit: str | None = None


def _matches(run: dict[str, Any], f: Filters) -> bool:
    checks = (
        (f.name, run.get("name")),
        (f.recipe, run.get("recipe")),
        (f.status, run.get("status")),
        (f.device, run.get("device")),
    )
    for pattern, value in checks:
        if pattern is not None and not fnmatch.fnmatchcase(str(value), pattern):
            return False
    if f.seed is not None and run.get("seed") != f.seed:
        return False
    return f.commit is None or str(run.get("git_commit") or "").startswith(f.commit)


def annotate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``val_bpb``, ``score`` (the primary score), ``projected`` [value, half width],
    ``core`` (the latest CORE score) and ``parent_diff`` to every run (a new list of new dicts)."""
    fits = official.fit_offsets(runs)
    by_dir = {r["run_dir"]: r for r in runs}
    annotated = []
    for run in runs:
        score = scores.primary_score(run)
        parent = by_dir.get(run.get("parent") or "")
        projected = official.project(score, fits)
        annotated.append(
            {
                **run,
                "score": score,
                "val_bpb": score["val_bpb"] if score else None,
                "projected": list(projected) if projected else None,
                "core": (scores.core_score(run) or {}).get(scores.CORE),
                "parent_name": parent["name"] if parent else None,
                "parent_diff": reader.recipe_diff(parent["recipe_json"], run["recipe_json"]) if parent else None,
                # Trained a different number of steps than its parent: not comparable as equals.
                "confounded": bool(parent and confound.confounded([parent], [run])),
                # Deleted or moved since it was indexed: its rows stay until `trnf runs rebuild`.
                "present": Path(run["run_dir"]).is_dir(),
            }
        )
    return annotated


def select(runs: list[dict[str, Any]], filters: Filters, sort: str = "created", limit: int | None = None) -> list[dict[str, Any]]:
    """Annotated runs passing ``filters``, sorted by ``sort`` (a leading ``-``: descending;
    runs without a value go last either way)."""
    descending = sort.startswith("-")
    column = sort.lstrip("-")
    known = set(runs[0]) if runs else set()
    if runs and column not in known and column not in DERIVED:
        names = ", ".join(sorted(c for c in known if c not in ("scores", "official", "env", "recipe_json")) + list(DERIVED))
        raise UsageError(f"--sort {sort}: no such column (one of: {names})")
    chosen = [r for r in annotate(runs) if _matches(r, filters)]

    def value(run: dict[str, Any]) -> Any:
        found = run.get(column)
        if column == "projected" and found is not None:
            found = found[0]
        if isinstance(found, float) and math.isnan(found):
            return None
        return found

    present = [r for r in chosen if value(r) is not None]
    numeric = all(isinstance(value(r), (int, float)) for r in present)
    present.sort(key=lambda r: value(r) if numeric else str(value(r)), reverse=descending)
    chosen = present + [r for r in chosen if value(r) is None]
    return chosen[:limit] if limit else chosen


def short_diff(diff: dict[str, list[Any]] | None, width: int = 3) -> str:
    """``optim.matrix_lr 0.02->0.03, ...``: the first few differing keys."""
    if diff is None:
        return "-"
    if not diff:
        return "same"
    shown = {k: v for k, v in diff.items() if k != "runtime.seed"}  # seeds are a column of their own
    if not shown:
        return "same (but the seed)"
    parts = [f"{key.split('.')[-1]} {old}->{new}" for key, (old, new) in list(shown.items())[:width]]
    more = len(shown) - width
    return ", ".join(parts) + (f" (+{more})" if more > 0 else "")
