"""One run directory -> the ledger's rows for it: the run, its scores, its official scores.

Reads only files: ``recipe.json`` and ``summary.json`` (written by the trainer),
``provenance.json``, ``scores.jsonl`` and ``official.jsonl`` (written by the tool, see
``provenance``). A run directory without ``recipe.json`` is not a run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnfrontier.ledger.provenance import read_json
from trnfrontier.runtime.rundir import (
    FINAL_DIR,
    METRICS_FILE,
    OFFICIAL_FILE,
    PROVENANCE_FILE,
    RECIPE_FILE,
    SCORES_FILE,
    SUMMARY_FILE,
    read_jsonl,
)

# Keys that name a run rather than configure it: runs differing only here are seeds of
# one recipe.
NOT_CONFIGURATION = (("name",), ("description",), ("runtime", "seed"))


def is_run_dir(path: Path) -> bool:
    """A recipe run (its recipe.json) or a finished `trnf train --train-py` kit run."""
    return (path / RECIPE_FILE).is_file() or kit_recipe(path) is not None


def kit_recipe(run_dir: Path) -> dict[str, Any] | None:
    """What stands for a kit run's recipe (it has none: the script and how it was
    launched), from its summary.json; None for anything else."""
    summary = read_json(run_dir / SUMMARY_FILE)
    if not summary or summary.get("mode") != "kit":
        return None
    script = str(summary.get("train_py") or "train.py")
    return {"name": Path(script).name, "train_py": script, "train_py_sha256": summary.get("train_py_sha256"),
            "launch": summary.get("launch")}  # fmt: skip


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"matrix_lr": 0.02}}`` -> ``{"optim.matrix_lr": 0.02}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def recipe_key(recipe: dict[str, Any]) -> str:
    """A short hash of the configuration, blind to name, description and seed: the runs
    of one recipe with different seeds share it."""
    skip = {".".join(path) for path in NOT_CONFIGURATION}
    config = {k: v for k, v in flatten(recipe).items() if k not in skip}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]


def recipe_diff(parent: dict[str, Any], child: dict[str, Any]) -> dict[str, list[Any]]:
    """``{"optim.matrix_lr": [0.02, 0.03]}``: every key whose value differs (name excluded)."""
    a, b = flatten(parent), flatten(child)
    return {
        key: [a.get(key), b.get(key)]
        for key in sorted(set(a) | set(b))
        if key not in ("name", "description") and a.get(key) != b.get(key)
    }


@dataclass
class RunEntry:
    """Rows for one run: ``run`` (one per run), ``scores`` and ``official`` (any number)."""

    run: dict[str, Any]
    recipe: dict[str, Any]
    scores: list[dict[str, Any]] = field(default_factory=list)
    official: list[dict[str, Any]] = field(default_factory=list)


def _train_score(summary: dict[str, Any], prov: dict[str, Any], when: float) -> dict[str, Any] | None:
    value = summary.get("val_bpb")
    if not isinstance(value, (int, float)):
        return None
    return {
        "source": "train",
        "val_bpb": float(value),
        # The tokens asked for name the setting; the count evaluated is kept beside it.
        "num_tokens": summary.get("eval_tokens") or summary.get("eval_num_tokens"),
        "counted_tokens": summary.get("eval_num_tokens"),
        "num_bytes": summary.get("eval_num_bytes"),
        "seq_len": summary.get("eval_seq_len"),
        "split": summary.get("eval_split", "public_val"),
        "prepare_sha256": summary.get("prepare_sha256"),
        "tokenizer_sha256": summary.get("tokenizer_sha256"),
        "dataset": prov.get("dataset"),
        "data_id": prov.get("data_id"),
        "status": "ok",
        "recorded": when,
    }


def read_run(run_dir: Path) -> RunEntry | None:
    """The ledger rows of ``run_dir``, or None when it is not a run directory."""
    run_dir = run_dir.resolve()
    recipe = read_json(run_dir / RECIPE_FILE) or kit_recipe(run_dir)
    if recipe is None:
        return None
    summary = read_json(run_dir / SUMMARY_FILE) or {}
    prov = read_json(run_dir / PROVENANCE_FILE) or {}
    git = prov.get("git") or {}
    runtime = recipe.get("runtime") or {}
    created = prov.get("created")
    if not isinstance(created, (int, float)):
        created = _mtime(run_dir / RECIPE_FILE) or 0.0
    finished = _mtime(run_dir / SUMMARY_FILE)
    run = {
        "run_dir": str(run_dir),
        "name": run_dir.name,
        "recipe": recipe.get("name"),
        "recipe_ref": prov.get("recipe_ref"),
        "recipe_key": recipe_key(recipe),
        "overrides": prov.get("overrides") or [],
        "parent": prov.get("parent"),
        "seed": runtime.get("seed"),
        "git_commit": git.get("commit"),
        "git_dirty": git.get("dirty"),
        "git_repo": git.get("repo"),
        "prepare_sha256": summary.get("prepare_sha256"),
        "tokenizer_sha256": summary.get("tokenizer_sha256"),
        "dataset": prov.get("dataset"),
        "data_id": prov.get("data_id"),
        "device": summary.get("device") or runtime.get("device"),
        "world_size": summary.get("world_size") or runtime.get("nproc"),
        "lnc": runtime.get("lnc") or summary.get("lnc"),
        "env": prov.get("env") or {},
        "status": summary.get("status") or "incomplete",
        "steps": summary.get("steps"),
        "tokens": summary.get("tokens"),
        "tokens_per_second": summary.get("tokens_per_second"),
        "charged_seconds": summary.get("charged_seconds"),
        "params": summary.get("params"),
        "final_loss": summary.get("final_loss"),
        "created": created,
        "finished": finished,
        "speed_env": summary.get("speed_env"),
        **sweep_columns(prov.get("sweep")),
    }
    scores = []
    train = _train_score(summary, prov, finished or created)
    if train is not None:
        scores.append(train)
    scores.extend(s for s in read_jsonl(run_dir / SCORES_FILE) if isinstance(s.get("val_bpb"), (int, float)))
    official = [o for o in read_jsonl(run_dir / OFFICIAL_FILE) if isinstance(o.get("official"), (int, float))]
    return RunEntry(run=run, recipe=recipe, scores=scores, official=official)


def sweep_columns(sweep: Any) -> dict[str, Any]:
    """The sweep a run was a trial of (provenance.json's ``sweep``) and its parameters."""
    if not isinstance(sweep, dict):
        return {"sweep": None, "sweep_params": None}
    params = sweep.get("params")
    return {"sweep": sweep.get("id"), "sweep_params": params if isinstance(params, dict) else None}


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def find_run_dirs(roots: list[Path]) -> list[Path]:
    """Run directories at or directly below each root (``runs/`` holds ``runs/<name>/``),
    and one level deeper (a sweep's ``runs/sweep/<name>/``)."""
    found: list[Path] = []
    for root in roots:
        candidates = [root, *_children(root)]
        candidates += [grand for child in _children(root) if not is_run_dir(child) for grand in _children(child)]
        found.extend(path.resolve() for path in candidates if is_run_dir(path))
    return sorted(set(found))


def _children(path: Path) -> list[Path]:
    try:
        return sorted(child for child in path.iterdir() if child.is_dir())
    except OSError:
        return []


def run_dir_of(path: Path) -> Path | None:
    """The run whose final model ``path`` is (``runs/x``, ``runs/x/final``,
    ``runs/x/final/final.pt``), or None: an intermediate checkpoint
    (``runs/x/checkpoints/step_000010``) is not the run's model, so its score is not the run's."""
    current = path.resolve()
    candidates = [current]
    if current.name == FINAL_DIR:
        candidates.append(current.parent)
    elif current.parent.name == FINAL_DIR:
        candidates.append(current.parent.parent)
    return next((c for c in candidates if is_run_dir(c)), None)


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's logged steps (for loss curves)."""
    return read_jsonl(Path(run_dir) / METRICS_FILE)
