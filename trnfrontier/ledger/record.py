"""Putting runs into the ledger: the hooks `trnf train` and `trnf eval` call, recording an
official score, finding runs by name, and rebuilding the index from run directories.

The hooks never fail the command they serve: a run that trained or a score that was
computed is worth more than its ledger row, so a ledger problem is one warning line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.ledger import provenance, reader, store
from trnfrontier.runtime.rundir import OFFICIAL_FILE, SCORES_FILE

DEFAULT_ROOTS = (Path("runs"),)
Warn = Callable[[str], None]


def _best_parent(runs: list[dict[str, Any]], recipe_name: str, run_dir: str) -> str | None:
    """The latest earlier run of the same recipe name, preferring one without overrides
    (the recipe as shipped or written is the natural reference for a variation)."""
    same = [r for r in runs if r.get("recipe") == recipe_name and r["run_dir"] != run_dir]
    plain = [r for r in same if not r.get("overrides")]
    chosen = (plain or same)[-1:] if (plain or same) else []
    return chosen[0]["run_dir"] if chosen else None


def start_run(
    run_dir: Path,
    recipe_name: str,
    recipe_ref: str,
    recipe_path: Path | None,
    overrides: list[str],
    dataset: str | None,
    warn: Warn,
) -> None:
    """Write provenance.json before a new run starts (git state as it is now, not after
    30 minutes of edits)."""
    try:
        parent = None
        path = store.ledger_path()
        if path.is_file():
            with store.open_ledger(path) as ledger:
                parent = _best_parent(ledger.runs(), recipe_name, str(run_dir.resolve()))
        record = provenance.capture(
            recipe_ref=recipe_ref, recipe_path=recipe_path, overrides=overrides, dataset=dataset, parent=parent
        )
        provenance.write_provenance(run_dir, record)
    except Exception as exc:  # noqa: BLE001 - the run matters more than its provenance
        warn(f"ledger: provenance of {run_dir} not recorded ({exc})")


def start_train(plan: Any, recipe_arg: str | None, extras: list[str], nproc: int | None, lnc: int | None, warn: Warn) -> None:
    """`trnf train`'s hook before a new run starts (a resumed run keeps its provenance)."""
    if plan.resume:
        return
    from trnfrontier.recipes.registry import resolve_recipe_path

    given = [recipe_arg] if recipe_arg is not None else []
    words = [*given, *extras]  # plan_from_arguments moved a leading key=value out of RECIPE
    ref = next((w for w in words if "=" not in w or Path(w).exists()), str(plan.recipe.name))
    overrides = [w for w in words if w != ref]
    overrides += [f"runtime.lnc={lnc}"] if lnc is not None else []
    overrides += [f"runtime.nproc={nproc}"] if nproc is not None else []
    path = resolve_recipe_path(ref)
    start_run(
        plan.run_dir, plan.recipe.name, ref, path if path.exists() else None, overrides,
        plan.recipe.data.dataset, warn,
    )  # fmt: skip


def index_run(run_dir: Path, warn: Warn) -> None:
    """(Re)index one run directory; a failure is a warning."""
    try:
        entry = reader.read_run(run_dir)
        if entry is None:
            return
        with store.open_ledger() as ledger:
            ledger.put(entry)
    except Exception as exc:  # noqa: BLE001
        warn(f"ledger: {run_dir} not recorded ({exc}); `trnf runs rebuild` adds it later")


def record_eval(document: dict[str, Any], warn: Warn) -> None:
    """Append each score of a `trnf eval` document to its run's scores.jsonl and reindex.
    A checkpoint outside a run directory (a kit's out/final.pt) has no run to record to."""
    when = time.time()
    data = provenance.data_identity(None)
    for result in document.get("results", []):
        value = result.get("val_bpb")
        if result.get("train_py") or not isinstance(value, (int, float)) or result.get("status") == "error":
            continue
        run_dir = reader.run_dir_of(Path(result["path"]))
        if run_dir is None:
            continue
        line = {
            "source": "eval",
            "val_bpb": float(value) if math.isfinite(value) else None,
            "num_tokens": result.get("tokens_requested") or result.get("num_tokens"),
            "counted_tokens": result.get("num_tokens"),
            "num_bytes": result.get("num_bytes"),
            "seq_len": result.get("seq_len"),
            "split": document.get("split", "public_val"),
            "prepare_sha256": result.get("prepare_sha256") or document.get("prepare_sha256"),
            "tokenizer_sha256": result.get("tokenizer_sha256"),
            **data,
            "status": result.get("status"),
            "recorded": when,
            **core_columns(result.get("core")),
        }
        if line["val_bpb"] is None:
            continue
        try:
            provenance.append_line(run_dir / SCORES_FILE, line)
        except OSError as exc:
            warn(f"ledger: score of {run_dir} not recorded ({exc})")
            continue
        index_run(run_dir, warn)


def core_columns(core: dict[str, Any] | None) -> dict[str, Any]:
    """A `trnf eval --core` report as the score line's CORE columns (none without one)."""
    if not isinstance(core, dict) or not isinstance(core.get("core_metric"), (int, float)):
        return {}
    return {
        "core": float(core["core_metric"]),
        "core_bundle_sha256": core.get("bundle_sha256"),
        "core_max_per_task": core.get("max_per_task"),
        "core_crop": core.get("crop"),
    }


# ---------------------------------------------------------------------- reading the ledger


def load_runs(roots: list[Path] | None = None, note: Warn | None = None) -> list[dict[str, Any]]:
    """Every indexed run. A missing ledger is rebuilt first from ``roots`` (default runs/)."""
    path = store.ledger_path()
    if not path.is_file():
        count = rebuild(roots or list(DEFAULT_ROOTS))
        if note is not None:
            searched = ", ".join(str(r) for r in roots or DEFAULT_ROOTS)
            note(f"no ledger at {path}: rebuilt it from {count} run director{'y' if count == 1 else 'ies'} under {searched}")
    with store.open_ledger(path) as ledger:
        return ledger.runs()


def rebuild(roots: list[Path]) -> int:
    entries = []
    for run_dir in reader.find_run_dirs(roots):
        entry = reader.read_run(run_dir)
        if entry is not None:
            entries.append(entry)
    return store.rebuild(entries)


def find_run(runs: list[dict[str, Any]], ref: str) -> dict[str, Any]:
    """A run by directory path or by name; unknown or ambiguous names are a clear error.
    A run directory not in the ledger yet is indexed on the way."""
    path = Path(ref).expanduser()
    if reader.is_run_dir(path):
        key = str(path.resolve())
        for run in runs:
            if run["run_dir"] == key:
                return run
        index_run(path, warn=_raise)
        with store.open_ledger() as ledger:
            return next(r for r in ledger.runs() if r["run_dir"] == key)
    named = [r for r in runs if r["name"] == ref]
    if len(named) == 1:
        return named[0]
    if not named:
        raise UsageError(f"no run {ref!r} in the ledger ({store.ledger_path()}); `trnf runs` lists them, or give a run directory")
    where = ", ".join(r["run_dir"] for r in named)
    raise UsageError(f"{len(named)} runs are named {ref!r} ({where}); give the run directory instead")


def _raise(message: str) -> None:
    raise TrnfError(message)


def record_official(runs: list[dict[str, Any]], ref: str, score: float, note: str | None) -> dict[str, Any]:
    """Pair the leaderboard's score with the run's local public score; written to the run
    directory (official.jsonl) and indexed. Returns the line written."""
    from trnfrontier.ledger.scores import primary_score

    if not math.isfinite(score) or score <= 0:
        raise UsageError(f"official score {score}: give the val_bpb the leaderboard showed (a positive number)")
    run = find_run(runs, ref)
    local = primary_score(run)
    if local is None:
        raise TrnfError(
            f"run {run['name']} has no local score to pair with; score it first with `trnf eval {run['run_dir']}`"
        )
    line = {
        "official": float(score),
        "local_val_bpb": local["val_bpb"],
        "local_num_tokens": local.get("num_tokens"),
        "local_seq_len": local.get("seq_len"),
        "note": note,
        "recorded": time.time(),
    }
    run_dir = Path(run["run_dir"])
    provenance.append_line(run_dir / OFFICIAL_FILE, line)
    index_run(run_dir, warn=_raise)
    return line


def set_parent(runs: list[dict[str, Any]], ref: str, parent_ref: str | None) -> dict[str, Any] | None:
    """Make ``parent_ref`` the run ``ref`` is diffed against (None: no parent), in the
    run's provenance.json, and reindex. Returns the parent run."""
    run = find_run(runs, ref)
    parent = find_run(runs, parent_ref) if parent_ref is not None else None
    if parent is not None and parent["run_dir"] == run["run_dir"]:
        raise UsageError(f"{run['name']} cannot be its own parent")
    run_dir = Path(run["run_dir"])
    current = provenance.read_json(run_dir / provenance.PROVENANCE_FILE) or {}
    provenance.write_provenance(run_dir, {**current, "parent": parent["run_dir"] if parent else None})
    index_run(run_dir, warn=_raise)
    return parent
