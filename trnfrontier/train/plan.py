"""Planning a `trnf train` recipe run: everything decided before any compute is spent.

The recipe (with its overrides) is validated, the run directory chosen (a new one, a
resumed one, or one a stopped run left before its first checkpoint), what would make the
child fail at once is refused here, and the child's command and environment are fixed in a
``RunPlan``: ``python -m trnfrontier.train.worker`` for one process, torchrun for more.
``supervise.run_plan`` then runs it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnfrontier.child_env import data_env, diagnostics_env
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.hints import trnf_line
from trnfrontier.recipes.loading import load_recipe, validate_recipe
from trnfrontier.recipes.schema import Recipe
from trnfrontier.runtime import host_memory, runlock
from trnfrontier.runtime.checkpoint_ref import check_resumable, latest_checkpoint
from trnfrontier.runtime.data_home import (
    KIT_CACHE_DIR_ENV,
    data_home,
    data_root_reason,
    hidden_home,
)
from trnfrontier.runtime.integrity import DamagedFileError
from trnfrontier.runtime.prepare_loader import PREPARE_ENV
from trnfrontier.runtime.rundir import (
    COMPLETED,
    LOG_FILE,
    META_FILE,
    RECIPE_FILE,
    read_summary,
)
from trnfrontier.train.interrupted import checkpoint_meta, restartable
from trnfrontier.train.lifeline import supervisor_env
from trnfrontier.trusted_prepare import load_contract, selected_prepare_path

RUNS_DIR = Path("runs")
# What --name may be: one directory under runs/ (the recipe schema's name pattern).
RUN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass
class RunPlan:
    """Everything decided before any compute is spent."""

    recipe: Recipe
    run_dir: Path
    resume: bool
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # A run directory left by a run that stopped before its first checkpoint: cleared first.
    replaces: bool = False

    @property
    def nproc(self) -> int:
        return self.recipe.runtime.nproc


def split_overrides(items: list[str]) -> list[str]:
    """Command-line extras must be ``key.path=value``; anything else is a usage error."""
    for item in items:
        if item.startswith("-"):
            raise UsageError(f"unknown option {item!r} for `trnf train` (see `trnf train --help`)")
        if "=" not in item:
            raise UsageError(
                f"unexpected argument {item!r}: overrides are key.path=value (e.g. optim.matrix_lr=0.03)"
            )
    return items


def plan_from_arguments(
    recipe: str | None,
    extras: list[str],
    *,
    out: Path | None = None,
    name: str | None = None,
    nproc: int | None = None,
    lnc: int | None = None,
    resume: Path | None = None,
) -> RunPlan:
    """`trnf train`'s recipe-run arguments -> a new run's plan, or a resumed run's."""
    if recipe is not None and "=" in recipe and not Path(recipe).exists():
        extras = [recipe, *extras]  # `trnf train --resume DIR key=value`: no recipe was given
        recipe = None
    overrides = split_overrides(list(extras))
    if lnc is not None:
        overrides.append(f"runtime.lnc={lnc}")
    if resume is not None:
        if recipe is not None:
            raise UsageError("--resume RUN_DIR uses the run's own recipe.json; give no RECIPE with it")
        if out is not None or name is not None:
            raise UsageError("--resume RUN_DIR continues in RUN_DIR; --out and --name do not apply")
        return plan_resume(resume, overrides, nproc)
    if recipe is None:
        raise UsageError("give a RECIPE (a YAML path or a shipped name; `trnf recipes list`), or --resume RUN_DIR")
    return plan_new_run(recipe, overrides, out=out, name=name, nproc=nproc)


def plan_new_run(
    recipe_ref: str,
    overrides: list[str],
    *,
    out: Path | None = None,
    name: str | None = None,
    nproc: int | None = None,
) -> RunPlan:
    """Validate the recipe (with overrides) and choose a run directory that does not exist yet."""
    if out is not None and name is not None:
        raise UsageError("give --out DIR or --name NAME, not both")
    if name is not None and (not RUN_NAME.fullmatch(name) or name in (".", "..")):
        raise UsageError(
            f"--name {name!r}: a run name is letters, digits, '_', '.' and '-' (the run goes to runs/NAME); "
            "for another place give --out DIR"
        )
    extra = list(overrides)
    if nproc is not None:
        extra.append(f"runtime.nproc={nproc}")
    recipe = load_recipe(recipe_ref, extra)
    run_dir = out if out is not None else RUNS_DIR / (name or recipe.name)
    run_dir = run_dir.expanduser()
    writer = runlock.live_writer(run_dir)
    if writer is not None:
        raise TrnfError(
            f"run directory {run_dir} is being written right now by {writer.description}; nothing was changed. "
            "Choose another with --name NAME (or --out DIR)",
            exit_code=2,
        )
    replaces = restartable(run_dir)
    if not replaces and run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise TrnfError(
            f"run directory {run_dir} {_what_is_there(run_dir)}; nothing was changed. Choose another with "
            f"--name NAME (or --out DIR){_what_else(run_dir)}",
            exit_code=2,
        )
    plan = _checked_plan(recipe, run_dir, resume=False)
    plan.replaces = replaces
    return plan


def _what_is_there(run_dir: Path) -> str:
    """What an occupied run directory holds, in a phrase that is true of it."""
    summary = read_summary(run_dir) if run_dir.is_dir() else None
    status = (summary or {}).get("status")
    if status == COMPLETED:
        score = summary.get("val_bpb") if summary else None
        return "holds a run that completed" + (f" (val_bpb {score:.6f})" if isinstance(score, float) else "")
    if latest_checkpoint(run_dir) is not None:
        return f"holds a run that stopped ({status or 'no summary'}) with a checkpoint to continue from"
    if (run_dir / RECIPE_FILE).is_file():
        return f"holds a run that stopped ({status or 'no summary'}) before its first checkpoint"
    return "already exists and is not a run directory" if run_dir.is_dir() else "is a file"


def _what_else(run_dir: Path) -> str:
    """The other next step that works, when there is one: continuing a stopped run."""
    summary = read_summary(run_dir) if run_dir.is_dir() else None
    if (summary or {}).get("status") != COMPLETED and latest_checkpoint(run_dir) is not None:
        return f", or continue it with `{trnf_line('train', '--resume', str(run_dir))}`"
    return ""


def plan_resume(run_dir: Path, overrides: list[str], nproc: int | None = None) -> RunPlan:
    """Continue a run from its latest checkpoint with its own recipe.json."""
    run_dir = run_dir.expanduser()
    if overrides:
        raise UsageError(
            f"--resume continues with {run_dir / RECIPE_FILE} as it is; overrides are not allowed ({overrides[0]})"
        )
    if not run_dir.is_dir():
        raise TrnfError(f"--resume {run_dir}: no such directory", exit_code=2)
    # First: a live run has no summary and maybe no checkpoint yet, which is no reason to
    # call it unresumable; the one thing to say is who is writing it.
    writer = runlock.live_writer(run_dir)
    if writer is not None:
        raise TrnfError(
            f"--resume {run_dir}: that run is still going, written by {writer.description}; "
            f"follow it in {run_dir / LOG_FILE}, or to resume it from its last checkpoint instead, stop it first "
            f"({writer.how_to_stop(run_dir)})",
            exit_code=2,
        )
    recipe_path = run_dir / RECIPE_FILE
    if not recipe_path.is_file():
        raise TrnfError(
            f"--resume {run_dir}: not a run directory (no {RECIPE_FILE}); give a directory `trnf train` created",
            exit_code=2,
        )
    try:
        data = json.loads(recipe_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrnfError(
            f"{recipe_path} is unreadable ({exc}); this run cannot be resumed", exit_code=2
        ) from None
    if not isinstance(data, dict):
        raise TrnfError(
            f"{recipe_path} is not a recipe (a JSON object); this run cannot be resumed",
            exit_code=2,
        )
    recipe = validate_recipe(data, str(recipe_path))
    if nproc is not None and nproc != recipe.runtime.nproc:
        raise UsageError(
            f"--nproc {nproc} differs from the run's runtime.nproc={recipe.runtime.nproc}; a run resumes with the same process count"
        )
    summary = read_summary(run_dir)
    if summary and summary.get("status") == COMPLETED:
        raise TrnfError(
            f"--resume {run_dir}: the run already completed (summary.json); start a new one with --name",
            exit_code=2,
        )
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise TrnfError(
            f"--resume {run_dir}: no complete checkpoint under checkpoints/ (run.checkpoint_every_seconds decides how often they are written)",
            exit_code=2,
        )
    try:
        check_resumable(latest)  # size and SHA256 of every file, before a worker starts
    except DamagedFileError as exc:
        raise TrnfError(f"--resume {run_dir}: {exc}") from None
    recorded = checkpoint_meta(latest).get("recipe")  # meta.json: just checked against its manifest
    if isinstance(recorded, dict) and recorded != data:
        raise TrnfError(
            f"--resume {run_dir}: {recipe_path} differs from the recipe {latest.name}/meta.json recorded (checked "
            f"against its manifest); refusing to continue the run with other settings: restore {RECIPE_FILE} "
            f"(the checkpoint's copy is the \"recipe\" object of {latest / META_FILE})",
            exit_code=2,
        )
    return _checked_plan(recipe, run_dir, resume=True)


def _checked_plan(recipe: Recipe, run_dir: Path, *, resume: bool) -> RunPlan:
    check_can_train(recipe)
    return RunPlan(
        recipe=recipe,
        run_dir=run_dir,
        resume=resume,
        command=launch_command(run_dir, recipe, resume=resume),
        env=launch_env(recipe),
    )


def check_can_train(recipe: Recipe) -> None:
    """What would make the child fail at once: vocabulary, data, device packages."""
    contract = load_contract()
    module = contract.module
    vocab = getattr(module, "TOKENIZER_VOCAB_SIZE", None)
    if vocab is not None and recipe.model.vocab_size != vocab:
        raise TrnfError(
            f"model.vocab_size={recipe.model.vocab_size} but {contract.path.name}'s tokenizer has TOKENIZER_VOCAB_SIZE={vocab}; "
            f"set model.vocab_size={vocab}",
            exit_code=2,
        )
    find_dataset = getattr(module, "dataset_dir", None)
    if callable(find_dataset):
        try:
            find_dataset(recipe.data.dataset)
        except Exception as exc:  # noqa: BLE001 - prepare.PrepareError, or a kit's own error type
            raise TrnfError(no_dataset_line(exc)) from None
    check_token_files(module, recipe.data.dataset)
    device = recipe.runtime.device
    from trnfrontier.runtime.devices import NEURON_PIP_HINT  # imports torch: after the cheap checks

    if device == "neuron" and importlib.util.find_spec("torch_neuronx") is None:
        raise TrnfError(
            f"runtime.device=neuron: {NEURON_PIP_HINT}; or train elsewhere with runtime.device=cpu|cuda",
            exit_code=2,
        )
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise TrnfError(
                "runtime.device=cuda but torch sees no CUDA device; use runtime.device=cpu or auto",
                exit_code=2,
            )


def no_dataset_line(exc: Exception) -> str:
    """prepare.py's "not prepared" refusal, with the data root it looked in and why that
    one; where the kit's variable hides datasets prepared under $TRNF_HOME, the way back."""
    root, why = data_home(), data_root_reason()
    hidden = hidden_home()
    if hidden is not None:
        return (
            f"no prepared dataset to train on under {root} (the data root, chosen by {why}); the datasets "
            f"prepared under {hidden} are used once {KIT_CACHE_DIR_ENV} is unset"
        )
    return f"no prepared dataset to train on: {exc} (data root {root}, chosen by {why})"


def check_token_files(module: Any, dataset: str | None) -> None:
    """Size and SHA256 of every token file against the dataset's manifest, before any
    compute is spent (a flipped byte would otherwise train silently on other tokens).
    Only where the prepare.py offers the check: the organisers' has no token files."""
    verify = getattr(module, "verify_token_files", None)
    if not callable(verify):
        return
    try:
        verify(dataset)
    except Exception as exc:  # noqa: BLE001 - prepare.PrepareError (one line naming the file and the fix)
        raise TrnfError(str(exc)) from None


def launch_command(run_dir: Path, recipe: Recipe, resume: bool) -> list[str]:
    """The child's argv: plain python for one process, torchrun for more."""
    entry = [
        "-m",
        "trnfrontier.train.worker",
        "--recipe",
        str(run_dir / RECIPE_FILE),
        "--out",
        str(run_dir),
    ]
    if resume:
        entry.append("--resume")
    nproc = recipe.runtime.nproc
    if nproc > 1:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(nproc),
            *entry,
        ]
    return [sys.executable, *entry]


def launch_env(recipe: Recipe) -> dict[str, str]:
    """Environment additions: the same prepare.py and dataset in every worker, and the
    Neuron logical-core configuration from the recipe."""
    env = {**diagnostics_env(), **data_env(), **supervisor_env(), PREPARE_ENV: str(selected_prepare_path())}
    if recipe.data.dataset:
        env["TRNF_DATASET"] = recipe.data.dataset
    if recipe.runtime.device in ("neuron", "auto"):
        env["NEURON_LOGICAL_NC_CONFIG"] = str(recipe.runtime.lnc)
    # glibc reads these at process start: a CPU step's large tensors reuse heap blocks.
    env.update(host_memory.keep_freed_env(recipe.runtime.device))
    return env
