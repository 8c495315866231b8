"""THE generator of train.py: `trnf package`, `trnf package --single-file` and `trnf init`.

Every generated train.py is the same program: it embeds a resolved recipe as plain data,
trains it with the runtime's budgeted trainer (``trnfrontier.runtime.trainer.train``,
which keeps the organisers' clock through ``prepare.record_step_boundary``), writes the
run under ``out/run/`` and publishes the consolidated checkpoint where the organisers
look for it: ``out/final.pt`` with ``model.safetensors`` and ``meta.json`` beside it. It
defines ``load_for_eval(checkpoint_path, device)``.

Two shapes of the same program:

- ``package``: ``from trnfrontier.runtime... import ...``; the runtime modules it needs
  ship beside it in the archive (``runtime_members``), unchanged;
- ``single``: the runtime modules inlined by ``flatten`` into the file itself, for a
  portal that takes one file and for a team that wants one file it owns (`trnf init`).

Environment variables it honours (what `trnf verify --dry-run` and kit-mode dry runs set):
``TRNF_DRY_RUN_STEPS`` (stop after that many steps; no evaluation or periodic
checkpoints; at most 2 rows a micro-step and 2 micro-steps, so a full-size recipe still
steps on a CPU), ``TRNF_DEVICE`` (e.g. ``cpu``: float32, no compile).
"""

from __future__ import annotations

import pprint
from pathlib import Path
from typing import Any, Literal

from trnfrontier import __version__
from trnfrontier.contract.kit import OUT_DIR_ENV
from trnfrontier.errors import TrnfError
from trnfrontier.kit.harness import DRY_RUN_STEPS_ENV
from trnfrontier.packaging.flatten import flatten, module_closure
from trnfrontier.runtime.rundir import KIT_OUT_DIR

Mode = Literal["package", "single"]
RUNTIME_PACKAGE = "trnfrontier.runtime"
RUNTIME_DIR = Path(__file__).resolve().parents[1] / "runtime"
DEVICE_ENV = "TRNF_DEVICE"
# Modules train.py itself calls; everything they import comes along.
_ROOTS = ["trainer", "checkpoint", "rundir", "recipe"]
# CORE's scoring forward: the model's ragged methods fall back to its plain forward without it.
_NO_RAGGED = "this single-file train.py carries no ragged scoring forward (runtime/ragged_forward.py)"
_NO_KERNELS = "this single-file train.py carries no NKI kernel dispatch (`trnf package` without --single-file ships it)"

# The names the generated code defines after the runtime (checked against it when inlining).
_RESERVED = {
    "RECIPE": "the embedded recipe",
    "OUT_DIR": "where the checkpoint is published",
    "RUN_DIR": "the run directory",
    "DRY_RUN_STEPS_ENV": "dry-run variable",
    "DEVICE_ENV": "device variable",
    "effective_recipe": "dry-run/device adjustments",
    "publish_final": "checkpoint publication",
    "print_results": "the kit's closing block",
    "main": "the entry point",
}

_BODY = '''
RECIPE: dict = {recipe}

# The kit's knob, as the organisers' train.py reads it: each launcher's own output folder.
OUT_DIR = Path(os.environ.get("{out_env}") or "{out_dir}")
RUN_DIR = OUT_DIR / "run"
DRY_RUN_STEPS_ENV = "{steps_env}"
DEVICE_ENV = "{device_env}"


def effective_recipe(recipe: dict, environ=os.environ) -> dict:
    """The recipe to train: RECIPE, unless a dry run or a device override asks for less."""
    r = copy.deepcopy(recipe)
    device = environ.get(DEVICE_ENV)
    if device:
        r["runtime"]["device"] = device
        if device == "cpu":
            r["runtime"]["dtype"] = "float32"
            r["runtime"]["compile"] = False
    steps = environ.get(DRY_RUN_STEPS_ENV)
    if steps:
        # A dry run proves the program starts, steps on every rank and checkpoints; it
        # does not measure anything, so it skips evaluation and uses a small batch.
        world = int(environ.get("WORLD_SIZE", "1"))
        seq = int(r["model"]["sequence_len"])
        data = r["data"]
        total = data.get("total_batch_tokens")
        accum = grad_accum_steps(int(data["batch_size"]), seq, world, total)
        data["batch_size"] = min(int(data["batch_size"]), 2)
        data["total_batch_tokens"] = data["batch_size"] * seq * world * min(accum, 2) if total else None
        r["budget"]["max_steps"] = int(steps)
        r["eval"]["final"] = False
        r["eval"]["every_seconds"] = None
        r["run"]["checkpoint_every_seconds"] = None
        r["run"]["log_every_steps"] = 1
    return r


def publish_final(run_dir: Path, out_dir: Path) -> None:
    """Copy the consolidated checkpoint to out/ (final.pt, model.safetensors, meta.json and
    the manifest of their sizes and SHA256s, which `trnf eval` checks them against), each
    through a temporary name, so out/final.pt is never half-written."""
    for name in (MODEL_FILE, META_FILE, KIT_FILE, MANIFEST_FILE):
        tmp = out_dir / (".tmp-" + name)
        shutil.copyfile(run_dir / FINAL_DIR / name, tmp)
        os.replace(tmp, out_dir / name)
{load_for_eval}

def print_results(summary: dict, checkpoint: Path) -> None:
    """The kit train.py's closing block: a line ``---``, then ``key: value`` lines (what a
    launcher reads: the public score of the final evaluation, the steps, the charge)."""
    scored = summary.get("val_bpb") is not None
    rows = [
        ("checkpoint_path", checkpoint),
        ("training_seconds", summary.get("charged_seconds")),
        ("budget_seconds", summary.get("budget_seconds")),
        ("num_steps", summary.get("steps")),
        ("public_val_bpb", summary.get("val_bpb")),
        ("eval_tokens", summary.get("eval_tokens") if scored else None),
        ("eval_seq_len", summary.get("eval_seq_len") if scored else None),
        ("eval_seconds", summary.get("eval_seconds")),
    ]
    print("---")
    for key, value in rows:
        if value is not None:
            print(f"{{key}}: {{value}}", flush=True)


def main() -> int:
    recipe = effective_recipe(RECIPE)
    # A launcher that reads the step-boundary log elsewhere says where (kit runs, dry runs).
    summary = train(recipe, RUN_DIR, step_log=os.environ.get(STEP_LOG_ENV) or None)
    if summary.get("status") != COMPLETED:
        return exit_code_for(summary.get("status"))
    if int(os.environ.get("RANK", "0")) == 0:
        publish_final(RUN_DIR, OUT_DIR)
        print_results(summary, OUT_DIR / KIT_FILE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

_LOAD_FOR_EVAL = '''

def load_for_eval(checkpoint_path: str, device) -> torch.nn.Module:
    """The organisers' entry point: the consolidated model of out/final.pt, eval mode."""
    return _load_checkpoint(checkpoint_path, device)

'''


def uses_kernels(recipe: dict[str, Any]) -> list[str]:
    """The kernels the recipe's ``kernels:`` section turns on (``auto`` or ``on``)."""
    return sorted(name for name, choice in (recipe.get("kernels") or {}).items() if choice != "off")


def _body(recipe: dict[str, Any], *, load_for_eval: str) -> str:
    return _BODY.format(
        recipe=pprint.pformat(recipe, indent=1, width=100, sort_dicts=True),
        out_dir=KIT_OUT_DIR,
        out_env=OUT_DIR_ENV,
        steps_env=DRY_RUN_STEPS_ENV,
        device_env=DEVICE_ENV,
        load_for_eval=load_for_eval,
    )


def _docstring(recipe: dict[str, Any], mode: Mode, purpose: str) -> str:
    shape = (
        "It imports the trnfrontier runtime shipped beside it (trnfrontier/runtime/)."
        if mode == "package"
        else "The trnfrontier runtime it needs is inlined below (one file, no trnf install)."
    )
    return (
        f'"""train.py: {purpose} (recipe {recipe.get("name")!r}; generated by trnf {__version__}).\n\n'
        "Trains RECIPE (below) with the budgeted trainer under the organisers' launch command,\n"
        f"e.g. `torchrun --standalone --nproc_per_node=N train.py`, with the trusted prepare.py beside it.\n"
        f"{shape}\n"
        f"Writes the run to {KIT_OUT_DIR}/run/ and the checkpoint to {KIT_OUT_DIR}/final.pt (+ model.safetensors, meta.json, manifest.json);\n"
        f"{OUT_DIR_ENV} names another folder for both, as it does for the kit's train.py.\n"
        "load_for_eval(checkpoint_path, device) loads it back for the scorer.\n"
        f"{DRY_RUN_STEPS_ENV}=N stops after N steps (a dry run); {DEVICE_ENV}=cpu trains on the CPU;\n"
        f"TRNF_STEP_LOG moves the step-boundary log (default {KIT_OUT_DIR}/run/step_boundaries.jsonl).\n"
        '"""\n'
    )


def render_train_py(
    recipe: dict[str, Any], mode: Mode, purpose: str = "a trnfrontier submission"
) -> str:
    """The train.py source for ``recipe`` in the given shape (deterministic: same input, same text)."""
    head = _docstring(recipe, mode, purpose)
    if mode == "package":
        imports = (
            "from __future__ import annotations\n\n"
            "import copy\nimport os\nimport shutil\nimport sys\nfrom pathlib import Path\n\nimport torch\n\n"
            "from trnfrontier.runtime.checkpoint import load_for_eval as _load_checkpoint\n"
            "from trnfrontier.runtime.recipe import grad_accum_steps\n"
            "from trnfrontier.runtime.rundir import (\n"
            "    COMPLETED,\n    FINAL_DIR,\n    KIT_FILE,\n    MANIFEST_FILE,\n    META_FILE,\n    MODEL_FILE,\n    STEP_LOG_ENV,\n    exit_code_for,\n)\n"
            "from trnfrontier.runtime.trainer import train\n"
        )
        return head + "\n" + imports + _body(recipe, load_for_eval=_LOAD_FOR_EVAL)
    if uses_kernels(recipe):
        raise TrnfError(
            f"--single-file cannot inline NKI kernels (the recipe turns on {', '.join(uses_kernels(recipe))}); "
            "package without --single-file, or set those kernels to off"
        )
    # The trainer imports the kernel dispatch only when a kernel is on, which this file refuses.
    merged = flatten(RUNTIME_DIR, RUNTIME_PACKAGE, _ROOTS, _RESERVED, omit={"kernels": _NO_KERNELS, "ragged_forward": _NO_RAGGED})
    glue = (
        f"\n\n# {'-' * 20} train.py {'-' * 20}\n\nimport copy\nimport os\nimport shutil\nimport sys\nfrom pathlib import Path\n"
        "# load_for_eval(checkpoint_path, device) is the runtime's, defined above (checkpoint.py).\n"
    )
    return head + merged.source + glue + _body(recipe, load_for_eval="\n")


def runtime_members() -> dict[str, Path | bytes]:
    """What a ``package``-shape train.py imports: archive member name -> source file (or bytes)."""
    members: dict[str, Path | bytes] = {}
    for path in module_closure(RUNTIME_DIR, RUNTIME_PACKAGE, _ROOTS):
        members[f"trnfrontier/runtime/{path.relative_to(RUNTIME_DIR).as_posix()}"] = path
    members["trnfrontier/runtime/__init__.py"] = RUNTIME_DIR / "__init__.py"
    # Not the tool's __init__: only what a submission needs (the version the trainer records).
    members["trnfrontier/__init__.py"] = (
        '"""The part of trnfrontier (`trnf`) a submission carries: trnfrontier.runtime, shipped beside train.py."""\n\n'
        f'__version__ = "{__version__}"\n'
    ).encode()
    return members
