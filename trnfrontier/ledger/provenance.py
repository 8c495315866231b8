"""What a run directory cannot say about itself, captured when the run starts, and the
ledger's own files inside a run directory.

The run directory is the record; the SQLite ledger is an index of run directories that
can be rebuilt from them (``trnf runs rebuild``). So everything the ledger shows is
written into the run directory first:

- ``provenance.json`` (when ``trnf train`` starts): the recipe as given and its overrides,
  the git commit and dirty state of the recipe's repository, the dataset and its
  validation data's identity, the environment variables that change a run, the parent run.
- ``scores.jsonl`` (each ``trnf eval`` of the run): one line per score.
- ``official.jsonl`` (each ``trnf runs record-official``): the leaderboard's score.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from trnfrontier.runtime.atomic import atomic_write_json, fsync_dir
from trnfrontier.runtime.data_home import data_home
from trnfrontier.runtime.rundir import PROVENANCE_FILE

# Variables that change what a run computes or how fast (compiler flags, core layout,
# threads, which data), recorded with every run. Names that look like secrets never are.
ENV_PREFIXES = ("NEURON_", "XLA_", "NCCL_", "FI_")
ENV_NAMES = ("OMP_NUM_THREADS", "MALLOC_ARENA_MAX", "TRNF_DATASET", "TRNF_PREPARE", "PYTORCH_CUDA_ALLOC_CONF")
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")
# Set by `trnf sweep` for each trial's `trnf train`: {"id", "trial", "params"} as JSON.
SWEEP_ENV = "TRNF_SWEEP_TRIAL"
GIT_TIMEOUT_SECONDS = 10.0


def relevant_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment variables worth recording beside a score (sorted)."""
    source = os.environ if environ is None else environ
    chosen = {
        name: value
        for name, value in source.items()
        if (name.startswith(ENV_PREFIXES) or name in ENV_NAMES)
        and not any(word in name.upper() for word in SECRET_WORDS)
    }
    return dict(sorted(chosen.items()))


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None  # no git, or a hung filesystem: the run is recorded without it
    return done.stdout.strip() if done.returncode == 0 else None


def sweep_trial(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The sweep trial this run is (``TRNF_SWEEP_TRIAL``), or None outside a sweep."""
    raw = (os.environ if environ is None else environ).get(SWEEP_ENV)
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def git_state(path: Path) -> dict[str, Any]:
    """Commit and dirty state of the repository holding ``path`` (all None outside one).
    Dirty means tracked files differ from the commit: the recipe on disk may not be the
    one the commit holds."""
    directory = path if path.is_dir() else path.parent
    root = _git(directory, "rev-parse", "--show-toplevel")
    if root is None:
        return {"repo": None, "commit": None, "dirty": None}
    commit = _git(directory, "rev-parse", "HEAD")
    status = _git(directory, "status", "--porcelain", "--untracked-files=no")
    return {"repo": root, "commit": commit, "dirty": None if status is None else bool(status)}


def data_identity(dataset: str | None, home: Path | None = None) -> dict[str, Any]:
    """The prepared dataset a run reads (name as selected: recipe, else $TRNF_DATASET, else
    the active one) and a short hash of its validation shards' SHA256s, so that scores
    on different validation data are never compared. Unknown parts are None (a kit's
    own prepare.py keeps its data elsewhere)."""
    root = home or data_home()
    name = dataset or os.environ.get("TRNF_DATASET")
    if not name:
        try:
            name = (root / "active").read_text(encoding="utf-8").strip() or None
        except OSError:
            name = None
    if name is None:
        return {"dataset": None, "data_id": None}
    try:
        manifest = json.loads((root / "datasets" / name / "manifest.json").read_text(encoding="utf-8"))
        shards = [s["sha256"] for s in manifest["shards"] if s.get("role") == "public_val"]
    except (OSError, ValueError, KeyError, TypeError):
        return {"dataset": name, "data_id": None}
    if not shards:
        return {"dataset": name, "data_id": None}
    digest = hashlib.sha256("\n".join(sorted(shards)).encode()).hexdigest()[:16]
    return {"dataset": name, "data_id": f"{name}:{digest}"}


def capture(
    *,
    recipe_ref: str,
    recipe_path: Path | None,
    overrides: list[str],
    dataset: str | None,
    parent: str | None,
) -> dict[str, Any]:
    """Everything provenance.json holds, measured now (before the run starts)."""
    return {
        "recipe_ref": recipe_ref,
        "overrides": list(overrides),
        "git": git_state(recipe_path) if recipe_path is not None else {"repo": None, "commit": None, "dirty": None},
        "env": relevant_env(),
        **data_identity(dataset),
        "parent": parent,
        "sweep": sweep_trial(),
        "created": time.time(),
    }


def write_provenance(run_dir: Path, provenance: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / PROVENANCE_FILE, provenance)


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line durably; a reader skips a torn last line (see ``rundir.read_jsonl``)."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(path.parent)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
