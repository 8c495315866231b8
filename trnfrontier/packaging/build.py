"""Assemble a submission archive (format ``trnf-submission/1``, trnfrontier/submission.py).

``package_run`` packages a `trnf train` run directory; ``kit.package_kit`` a team's own
train.py. Both end in ``write_archive``: screen the code the archive ships with verify's
own static screen, check the portal's size limit, then ``build_manifest`` +
``write_deterministic_tar`` (sorted members, fixed mtimes/owners, temp file + rename),
so the same inputs give the same bytes and a failure never leaves a half-written archive.

Refusals (over budget, diverged/NaN, no measured val_bpb, prepare.py/tokenizer not the
pinned ones, a static-screen finding) are collected as reasons; ``--force`` turns them
into the manifest's ``forced`` list and a section of the write-up instead of an error.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnfrontier import __version__
from trnfrontier import submission as fmt
from trnfrontier.contract.inference_source import inference_py_source
from trnfrontier.contract.launch import (
    NPROC_CHOICES,
    LaunchError,
    choices_text,
    launch_line,
    parse_launch,
)
from trnfrontier.contract.phases import DEFAULT_PHASE, PHASES, Phase, phase_of
from trnfrontier.contract.pins import load_pins
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.packaging.finished_run import RunDir, checkpoint_params, read_run, refusal_reasons
from trnfrontier.packaging.trainpy import render_train_py, runtime_members, uses_kernels
from trnfrontier.packaging.writeup import (
    curve_caption,
    existing_team_text,
    loss_curve_png,
    read_loss_points,
    recipe_differences,
    render_writeup,
)
from trnfrontier.runtime.recipe import RecipeError, ResolvedRecipe, RuntimeSpec
from trnfrontier.runtime.rundir import KIT_FILE, META_FILE, MODEL_FILE, SUMMARY_FILE, read_jsonl
from trnfrontier.trusted_prepare import project_root_file
from trnfrontier.verify.screen import screen_members

BASELINE_RECIPE = "baseline_d10"


@dataclass(frozen=True)
class PackageResult:
    archive: Path
    manifest: dict[str, Any]
    size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "archive": str(self.archive),
            "bytes": self.size,
            "members": sorted(self.manifest["files"]),
            "claimed": self.manifest.get("claimed"),
            "params": self.manifest.get("params"),
            "launch": self.manifest.get("launch"),
            "forced": self.manifest.get("forced", []),
        }


# ---------------------------------------------------------------------------- shared pieces


def launch_for(runtime: RuntimeSpec, phase: Phase = PHASES[DEFAULT_PHASE]) -> str:
    """The organisers' launch line for a recipe's runtime (a shape of ``phase``)."""
    nproc, lnc = runtime.nproc, runtime.lnc
    if phase.number == DEFAULT_PHASE and nproc not in NPROC_CHOICES:
        raise TrnfError(
            f"runtime.nproc={nproc}: the organisers' launch takes --nproc_per_node {choices_text(NPROC_CHOICES)}; retrain with one of those"
        )
    if not phase.accepts(lnc, nproc):
        raise TrnfError(
            f"runtime.nproc={nproc} with LNC {lnc} is not a Phase {phase.number} launch ({phase.shapes_text()}); "
            "retrain with one of those, or give --launch with the shape the organisers will run"
        )
    return launch_line(nproc, lnc)


def typed_recipe(recipe: dict[str, Any], where: Path) -> ResolvedRecipe:
    """A run's recipe.json as the typed recipe its train.py will train (which reads it the
    same way, so one it cannot read is refused here rather than at the train.py's first line)."""
    try:
        return ResolvedRecipe.from_dict(recipe)
    except RecipeError as exc:
        raise TrnfError(f"{where}: its recipe is not one this trnf {__version__} can train ({exc}); retrain it with this trnf") from None


def check_launch(line: str, phase: Phase = PHASES[DEFAULT_PHASE]) -> str:
    """A launch line the organisers accept for ``phase``, stripped; a bad one is a usage error."""
    try:
        parse_launch(line, phase)
    except LaunchError as exc:
        raise UsageError(f"--launch {line!r}: {exc}") from None
    return line.strip()


def run_launch(recipe: ResolvedRecipe, phase: Phase, given: str | None) -> str:
    """The launch line of a run's archive: ``given`` (``--launch``: the shape the organisers
    will run, when the run rehearsed at another scale) or the recipe's own; either way one
    the recipe's batch divides across (else its train.py would stop at the first line)."""
    if given is None:
        return launch_for(recipe.runtime, phase)
    line = check_launch(given, phase)
    nproc = parse_launch(line, phase).nproc
    try:
        recipe.grad_accum_steps(nproc)
    except RecipeError as exc:
        raise UsageError(f"--launch {given!r}: the recipe's batch does not divide across {nproc} processes ({exc})") from None
    return line


def git_state() -> dict[str, Any]:
    """Commit and dirty flag of the trnf checkout that packages (None where it is not a git tree)."""
    root = project_root_file(".git")
    if root is None:
        return {"commit": None, "dirty": None}

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=root.parent, capture_output=True, text=True, check=True, timeout=30
        )
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": dirty}


def versions(recorded: dict[str, Any] | None) -> dict[str, Any]:
    """python/torch as the run recorded them, torch-neuronx as installed here, this trnf."""
    recorded = recorded or {}
    try:
        neuronx: str | None = importlib.metadata.version("torch-neuronx")
    except importlib.metadata.PackageNotFoundError:
        neuronx = None
    return {
        "python": recorded.get("python"),
        "torch": recorded.get("torch"),
        "torch_neuronx": neuronx,
        "trnf": __version__,
    }


def kernel_members(names: list[str]) -> dict[str, Path | bytes]:
    """kernels/<name>.py from the project's kernels/ directory for each kernel named."""
    directory = project_root_file("kernels")
    members: dict[str, Path | bytes] = {}
    for name in names:
        path = directory / f"{name}.py" if directory else None
        if path is None or not path.is_file():
            raise TrnfError(
                f"the recipe uses kernel {name!r} but kernels/{name}.py is not in this trnf installation"
            )
        members[f"kernels/{name}.py"] = path
    return members


def screen_reasons(members: dict[str, Path | bytes]) -> list[str]:
    """verify's static screen over every .py the archive would ship (one reason per finding)."""

    def read_text(name: str) -> str:
        source = members[name]
        return source.decode("utf-8") if isinstance(source, bytes) else Path(source).read_text(encoding="utf-8")

    findings, _ = screen_members(members, read_text)
    return [f"static screen: {finding}" for finding in findings]


def size_problems(members: dict[str, Path | bytes]) -> list[str]:
    """Uploaded code files over the portal's per-file limit."""
    over = []
    for name in fmt.code_members(list(members)):
        source = members[name]
        size = len(source) if isinstance(source, bytes) else Path(source).stat().st_size
        if size > fmt.PORTAL_FILE_LIMIT_BYTES:
            over.append(
                f"{name} is {size:,} bytes, over the portal's {fmt.PORTAL_FILE_LIMIT_BYTES:,}-byte limit"
            )
    return over


def refuse_or_force(reasons: list[str], force: bool, what: str) -> list[str]:
    """The reasons to record as forced, or a one-line refusal when not forcing."""
    if reasons and not force:
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        raise TrnfError(
            f"refusing to package {what}: {reasons[0]}{more}; fix it, or pass --force to package anyway (recorded in the manifest)"
        )
    return list(reasons)


def gate_members(
    members: dict[str, Path | bytes], reasons: list[str], *, force: bool, what: str, size_hint: str = ""
) -> list[str]:
    """The portal's size limit (never forced), then ``reasons`` plus verify's static screen:
    the list to record as forced, or a one-line refusal."""
    over = size_problems(members)
    if over:
        raise TrnfError(f"{over[0]}{size_hint}")
    return refuse_or_force(reasons + screen_reasons(members), force, what)


def manifest_meta(
    summary: dict[str, Any],
    *,
    measured_by: str,
    params: int,
    seed: Any,
    launch: str,
    forced: list[str],
    phase: int = DEFAULT_PHASE,
) -> dict[str, Any]:
    """The manifest's fields besides ``format`` and ``files``, from a run's summary
    (``phase`` only when it is not Phase 1, whose manifests stay as they were)."""
    return ({} if phase == DEFAULT_PHASE else {"phase": phase}) | {
        "prepare_sha256": summary.get("prepare_sha256"),
        "tokenizer_sha256": summary.get("tokenizer_sha256"),
        "claimed": claim(summary, measured_by),
        "params": params,
        "versions": versions(summary.get("versions")),
        "git": git_state(),
        "seed": seed,
        "launch": launch,
        "forced": forced,
    }


def write_archive(
    members: dict[str, Path | bytes], meta: dict[str, Any], out: Path
) -> PackageResult:
    """Write ``members`` + manifest.json to ``out`` deterministically and atomically."""
    out = Path(out)
    if out.is_dir():
        raise UsageError(
            f"-o {out}: is a directory; give the archive's file name (e.g. submission.tar)"
        )
    if not out.parent.is_dir():
        raise UsageError(f"-o {out}: directory {out.parent} does not exist")
    # Both take a member as a file path or as its bytes: nothing needs staging on disk.
    manifest = fmt.build_manifest(members, **meta)
    fmt.write_deterministic_tar({**members, fmt.MANIFEST: fmt.manifest_bytes(manifest)}, out)
    return PackageResult(out, manifest, out.stat().st_size)


def read_team_text(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--writeup {path}: no such file") from None
    except UnicodeDecodeError:
        raise UsageError(f"--writeup {path}: not UTF-8 text") from None


def baseline_recipe() -> dict[str, Any] | None:
    """recipes/baseline_d10.yaml resolved (None when this installation lacks it)."""
    from trnfrontier.recipes.loading import load_recipe
    from trnfrontier.recipes.registry import shipped_recipes

    path = shipped_recipes().get(BASELINE_RECIPE)
    return load_recipe(path).model_dump(mode="json") if path else None


def add_writeup(
    members: dict[str, Path | bytes],
    facts: dict[str, Any],
    recipe: dict[str, Any] | None,
    metrics: Path | None,
    forced: list[str],
    team_text: str | None,
    *,
    keep_marker: bool = False,
) -> None:
    """WRITEUP.md and, when there is a logged loss, loss_curve.png."""
    records = read_jsonl(metrics) if metrics else []
    points = read_loss_points(metrics) if metrics else []
    png = loss_curve_png(records, facts) if points else None
    if png is not None:
        members[fmt.LOSS_CURVE] = png
    baseline = baseline_recipe() if recipe is not None else None
    differences = (
        recipe_differences(recipe, baseline)
        if recipe is not None and baseline is not None
        else None
    )
    members[fmt.WRITEUP] = render_writeup(
        facts,
        differences,
        forced=forced,
        team_text=team_text,
        loss_curve=fmt.LOSS_CURVE if points else None,
        caption=curve_caption(points) if points else "",
        keep_marker=keep_marker,
    ).encode("utf-8")


def summary_facts(
    summary: dict[str, Any], *, name: str, source: str, launch: str, kernels: list[str]
) -> dict[str, Any]:
    keys = (
        "params",
        "tokens",
        "steps",
        "charged_seconds",
        "startup_seconds",
        "budget_seconds",
        "val_bpb",
        "eval_tokens",
        "tokens_per_second",
        "mfu",
        "device",
        "world_size",
    )
    facts = {key: summary.get(key) for key in keys}
    facts.update(
        name=name,
        source=source,
        launch=launch,
        kernels=kernels,
        val_bpb_official=summary.get("val_bpb_official"),
    )
    return facts


def claim(summary: dict[str, Any], measured_by: str) -> dict[str, Any] | None:
    """The manifest's ``claimed`` block from a summary's trusted evaluation (None when unmeasured)."""
    if summary.get("val_bpb") is None:
        return None
    return {
        "val_bpb": float(summary["val_bpb"]),
        "eval_tokens": int(summary.get("eval_tokens") or 0),
        "eval_seq_len": int(summary.get("eval_seq_len") or 0),
        "split": summary.get("eval_split") or "public_val",
        "measured_by": measured_by,
    }


# ---------------------------------------------------------------------------- a run directory


def package_run(
    run_dir: Path | RunDir,
    out: Path,
    *,
    writeup: Path | None = None,
    single_file: bool = False,
    force: bool = False,
    pins_file: Path | None = None,
    launch: str | None = None,
) -> PackageResult:
    """Package a `trnf train` run directory (or one ``read_run`` already read) as a
    submission archive at ``out``. A Phase 2 run also ships the ``inference.py`` the
    organisers run CORE through (``contract/inference_source.py``)."""
    run: RunDir = run_dir if isinstance(run_dir, RunDir) else read_run(run_dir)
    team_text = read_team_text(writeup)
    if team_text is None:  # the write-up trnf train left in the run directory, as the team edited it
        team_text = existing_team_text(run.path)
    recipe, summary = run.recipe, run.summary
    phase = phase_of(recipe)
    params, non_finite = checkpoint_params(run.final_dir / MODEL_FILE)
    reasons = refusal_reasons(
        summary,
        load_pins(pins_file),
        non_finite,
        step_log=run.step_log,
        unmeasured="summary.json has none: the run had eval.final off; run `trnf eval` on it",
        phase=phase,
    )
    launch = run_launch(typed_recipe(recipe, run.path), phase, launch)

    members: dict[str, Path | bytes] = {
        fmt.TRAIN_PY: render_train_py(recipe, "single" if single_file else "package").encode(
            "utf-8"
        ),
        fmt.LAUNCH_FILE: (launch + "\n").encode(),
        fmt.CHECKPOINT_SAFETENSORS: run.final_dir / MODEL_FILE,
        fmt.CHECKPOINT_META: run.final_dir / META_FILE,
        fmt.CHECKPOINT_FINAL_PT: run.final_dir / KIT_FILE,
        fmt.SUMMARY: run.path / SUMMARY_FILE,
        fmt.STEP_LOG: run.step_log,
        fmt.METRICS_LOG: run.metrics if run.metrics.is_file() else b"",
    }
    if phase.inference_py:
        members[fmt.INFERENCE_PY] = inference_py_source().encode("utf-8")
    kernels = uses_kernels(recipe)
    members.update(kernel_members(kernels))
    if not single_file:
        members.update(runtime_members())
    hint = " (the inlined runtime is too big for one file: package without --single-file)"
    forced = gate_members(
        members, reasons, force=force, what=f"run {run.path}", size_hint=hint if single_file else ""
    )

    facts = summary_facts(
        summary,
        name=str(summary.get("name") or run.path.name),
        source=f"run directory {run.path.name}",
        launch=launch,
        kernels=kernels,
    )
    add_writeup(members, facts, recipe, run.metrics, forced, team_text)
    meta = manifest_meta(
        summary,
        measured_by="trnf train: the trusted evaluate_bpb of final/ reloaded through load_for_eval",
        params=params,
        seed=int(recipe["runtime"]["seed"]),
        launch=launch,
        forced=forced,
        phase=phase.number,
    )
    return write_archive(members, meta, out)
