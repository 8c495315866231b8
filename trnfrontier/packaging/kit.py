"""Kit mode: package a team's own train.py as it is, with what it imports from its directory.

The files shipped beside train.py are found by reading imports with ``ast`` (never by
importing): every module name that resolves to a ``.py`` file (or a package's
``__init__.py``) under train.py's directory is shipped, transitively. ``prepare`` is the
organisers' file and is never shipped.

The checkpoint is the kit's ``final.pt`` (``model_state``, ``model_config``, ``meta``);
``model.safetensors`` and ``meta.json`` come from beside it, or are written from it.
Logs, summary and the measured val_bpb come from a kit-mode run directory
(``--run-dir``; by default ``run/`` beside the checkpoint, where `trnf init`'s train.py
writes it), or the val_bpb from ``--val-bpb-from-eval`` (the trusted evaluate_bpb).
"""

from __future__ import annotations

import ast
import io
import json
from pathlib import Path
from typing import Any

from trnfrontier import submission as fmt
from trnfrontier.contract.kit import EVAL_TOKENS_ENV
from trnfrontier.contract.phases import DEFAULT_PHASE
from trnfrontier.contract.phases import phase as phase_rules
from trnfrontier.contract.pins import load_pins
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.packaging.build import (
    PackageResult,
    add_writeup,
    check_launch,
    gate_members,
    manifest_meta,
    read_team_text,
    summary_facts,
    write_archive,
)
from trnfrontier.packaging.finished_run import (
    checkpoint_params,
    read_json,
    recorded_phase,
    refusal_reasons,
)
from trnfrontier.packaging.writeup import existing_team_text
from trnfrontier.runtime.integrity import DamagedFileError, check_recorded_sha256, check_weights
from trnfrontier.runtime.prepare_calls import constant
from trnfrontier.runtime.rundir import (
    META_FILE,
    METRICS_FILE,
    MODEL_FILE,
    STEP_LOG_FILE,
    SUMMARY_FILE,
)

NOT_SHIPPED = frozenset({"prepare", "train"})


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        raise TrnfError(
            f"{path}:{exc.lineno}: does not parse ({exc.msg}); fix it before packaging"
        ) from None


def _resolve(root: Path, dotted: str) -> list[Path]:
    """The files importing ``dotted`` runs under ``root``: parent packages' __init__.py and the module."""
    parts = dotted.split(".")
    if not parts[0] or parts[0] in NOT_SHIPPED:
        return []
    found: list[Path] = []
    for depth in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:depth])
        if (base / "__init__.py").is_file():
            found.append(base / "__init__.py")
        elif depth == len(parts) and base.with_suffix(".py").is_file():
            found.append(base.with_suffix(".py"))
        else:
            break
    return found


def imported_files(train_py: Path) -> dict[str, Path]:
    """Archive member name -> file for every local .py train.py imports, transitively (train.py excluded)."""
    root = train_py.resolve().parent
    todo, seen = [train_py.resolve()], {train_py.resolve()}
    while todo:
        path = todo.pop()
        package = path.parent.relative_to(root).parts
        candidates: list[str] = []
        for node in ast.walk(_parse(path)):
            if isinstance(node, ast.Import):
                candidates += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = (
                        list(package[: len(package) - (node.level - 1)])
                        if node.level - 1 <= len(package)
                        else None
                    )
                    if base is None:
                        continue
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                candidates.append(module)
                candidates += [
                    f"{module}.{alias.name}" if module else alias.name
                    for alias in node.names
                    if alias.name != "*"
                ]
        for dotted in candidates:
            for file in _resolve(root, dotted):
                if file not in seen:
                    seen.add(file)
                    todo.append(file)
    seen.discard(train_py.resolve())
    return {file.relative_to(root).as_posix(): file for file in sorted(seen)}


def checkpoint_members(checkpoint: Path) -> tuple[dict[str, Path | bytes], int, list[str]]:
    """checkpoint/ members from a kit final.pt (+ siblings), the parameter count, NaN/inf tensors."""
    if not checkpoint.is_file():
        raise UsageError(
            f"--checkpoint {checkpoint}: no such file (give the final.pt your train.py wrote, e.g. out/final.pt)"
        )
    # Here, not at the top: `trnf package` refuses bad arguments before it loads torch.
    import torch

    from trnfrontier.runtime.safetensors_io import write_safetensors

    try:
        blob = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unloadable file gets the same one line
        raise TrnfError(
            f"--checkpoint {checkpoint}: does not load with torch.load(weights_only=True) ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(blob, dict) or not isinstance(blob.get("model_state"), dict):
        raise TrnfError(
            f"--checkpoint {checkpoint}: not the kit's final.pt layout (a dict with model_state, model_config, meta)"
        )
    state = {name: t for name, t in blob["model_state"].items() if isinstance(t, torch.Tensor)}
    members: dict[str, Path | bytes] = {fmt.CHECKPOINT_FINAL_PT: checkpoint}
    safetensors, meta = checkpoint.with_name(MODEL_FILE), checkpoint.with_name(META_FILE)
    if safetensors.is_file():
        members[fmt.CHECKPOINT_SAFETENSORS] = safetensors
        params, non_finite = checkpoint_params(safetensors)
    else:
        buffer = io.BytesIO()
        config = blob.get("model_config")
        write_safetensors(
            buffer,
            state,
            {"format": "pt", "model_config": json.dumps(config, sort_keys=True, default=str)},
        )
        members[fmt.CHECKPOINT_SAFETENSORS] = buffer.getvalue()
        params = sum(t.numel() for t in state.values())
        non_finite = [
            name
            for name, t in sorted(state.items())
            if t.is_floating_point() and not bool(torch.isfinite(t).all())
        ]
    if meta.is_file():
        members[fmt.CHECKPOINT_META] = meta
    else:
        document = {
            "model_config": blob.get("model_config"),
            "meta": blob.get("meta"),
            "source": checkpoint.name,
        }
        members[fmt.CHECKPOINT_META] = (
            json.dumps(document, indent=2, sort_keys=True, default=str) + "\n"
        ).encode()
    return members, params, non_finite


def check_checkpoint(checkpoint: Path, run_dir: Path | None) -> None:
    """The checkpoint against what recorded it: the manifest beside it (the generated
    train.py publishes one) and the SHA256 the kit run's summary.json took when the run
    ended. A mismatch is refused by name: a changed checkpoint is not what the logs ran."""
    try:
        check_weights(checkpoint)
        if run_dir is not None and (run_dir / SUMMARY_FILE).is_file():
            summary = read_json(run_dir / SUMMARY_FILE, "summary.json")
            recorded, wrote = summary.get("checkpoint_sha256"), summary.get("final_checkpoint")
            if isinstance(recorded, str) and wrote and Path(str(wrote)).resolve() == checkpoint.resolve():
                check_recorded_sha256(checkpoint, recorded, run_dir / SUMMARY_FILE)
    except DamagedFileError as exc:
        raise TrnfError(
            f"{exc}; refusing to package it: package the checkpoint that run wrote (restore it from a copy), "
            "or train again"
        ) from None


def _measure(train_py: Path, checkpoint: Path) -> dict[str, Any]:
    """val_bpb now, through trnf eval's trusted evaluate_bpb in a fresh process."""
    from trnfrontier.evaluate.library import EvalOptions, Target, evaluate

    document = evaluate([Target(checkpoint, train_py)], EvalOptions())
    result = document["results"][0]
    if result["status"] != "ok":
        raise TrnfError(
            f"--val-bpb-from-eval: the trusted evaluation gave no valid score: {'; '.join(result['reasons'])}"
        )
    return {
        "val_bpb": result["val_bpb"],
        "eval_tokens": result["tokens_requested"],
        "eval_seq_len": result["seq_len"],
        "eval_split": document["split"],
        "prepare_sha256": document["prepare_sha256"],
    }


def _kit_block_score(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The public score the kit's train.py printed in its `---` block: its in-process call
    of the trusted prepare.evaluate_bpb after saving final.pt (None when it printed none)."""
    block = summary.get("kit_summary") or {}
    value = block.get("public_val_bpb")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    # What the eval scored: the block's numbers when it printed them, else the knob the run
    # was launched with, else the kit's default; the context only when printed (else
    # unknown, and `trnf verify --rerun-eval` says the claim lacks it).
    env = summary.get("kit_env") or {}
    tokens = block.get("eval_tokens") or env.get(EVAL_TOKENS_ENV) or constant(None, "EVAL_TOKENS_PUBLIC")
    return {
        "val_bpb": float(value),
        "eval_tokens": int(tokens),
        "eval_seq_len": int(block.get("eval_seq_len") or block.get("seq_len") or 0),
        "eval_split": "public_val",
        "measured_by": "the kit train.py's in-process public eval (prepare.evaluate_bpb), its `---` block",
    }


def _default_hashes() -> dict[str, Any]:
    """The prepare.py and tokenizer trnf uses now (for a kit run that recorded none)."""
    from trnfrontier.trusted_prepare import load_contract, recorded_tokenizer_sha256

    contract = load_contract()
    return {"prepare_sha256": contract.sha256, "tokenizer_sha256": recorded_tokenizer_sha256(contract)}


def _from_run_dir(
    run_dir: Path | None, checkpoint: Path | None, launch: str | None
) -> tuple[Path, str]:
    """--checkpoint and --launch, defaulting to what a kit run directory recorded."""
    if run_dir is not None and checkpoint is None:
        recorded = read_json(Path(run_dir) / SUMMARY_FILE, "summary.json").get("final_checkpoint")
        checkpoint = Path(recorded) if recorded else None
    if run_dir is not None and launch is None and (Path(run_dir) / fmt.LAUNCH_FILE).is_file():
        launch = (Path(run_dir) / fmt.LAUNCH_FILE).read_text(encoding="utf-8")
    if checkpoint is None or launch is None:
        missing = " and ".join(
            n
            for n, v in (("--checkpoint (e.g. out/final.pt)", checkpoint), ("--launch", launch))
            if v is None
        )
        raise UsageError(
            f"--train-py needs {missing}, or --run-dir of a `trnf train --train-py` run that recorded them"
        )
    return Path(checkpoint), launch


def run_phase(run_dir: Path | None, given: int | None) -> int:
    """The phase to package a kit run as: the one its directory recorded, unless ``given``
    (--phase) says otherwise, which is a usage error when the run recorded another."""
    recorded = recorded_phase(run_dir)
    if given is not None and recorded is not None and given != recorded:
        raise UsageError(
            f"--phase {given}: the run in {run_dir} was trained as Phase {recorded} (its launch shapes and budget); "
            f"package it without --phase, or train it again with `trnf train --train-py ... --phase {given}`"
        )
    return given or recorded or DEFAULT_PHASE


def _kit_summary(
    members: dict[str, Path | bytes],
    run_dir: Path | None,
    train_py: Path,
    checkpoint: Path,
    val_bpb_from_eval: bool,
) -> dict[str, Any]:
    """The run's facts for the archive: the kit run's summary.json and logs (added to
    ``members``), its score (or one measured now), the SHA256s of what trained."""
    summary: dict[str, Any] = {}
    if run_dir is not None:
        summary = read_json(
            run_dir / SUMMARY_FILE,
            "summary.json (is this a `trnf train --train-py` run directory?)",
        )
        for member, name in ((fmt.STEP_LOG, STEP_LOG_FILE), (fmt.METRICS_LOG, METRICS_FILE)):
            if (run_dir / name).is_file():
                members[member] = run_dir / name
        members[fmt.SUMMARY] = run_dir / SUMMARY_FILE
    if fmt.STEP_LOG not in members:
        where = f"{run_dir}/{STEP_LOG_FILE}" if run_dir else "a run directory"
        raise TrnfError(
            f"no step-boundary log ({where}): pass --run-dir with the run of `trnf train --train-py`, whose log proves the budget"
        )
    members.setdefault(fmt.METRICS_LOG, b"")
    kit_score = _kit_block_score(summary)
    if kit_score is not None and summary.get("val_bpb") is None and not val_bpb_from_eval:
        summary = {**summary, **kit_score}
    if val_bpb_from_eval:
        measured = _measure(train_py, checkpoint)
        # The run's own record of its prepare.py wins: the pins are about what trained.
        summary = {
            **summary,
            **measured,
            "prepare_sha256": summary.get("prepare_sha256") or measured["prepare_sha256"],
        }
    if not summary.get("prepare_sha256") or not summary.get("tokenizer_sha256"):
        for key, value in _default_hashes().items():
            summary[key] = summary.get(key) or value
    members.setdefault(fmt.SUMMARY, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())
    return summary


def package_kit(
    train_py: Path,
    checkpoint: Path | None,
    launch: str | None,
    out: Path,
    *,
    run_dir: Path | None = None,
    writeup: Path | None = None,
    force: bool = False,
    pins_file: Path | None = None,
    val_bpb_from_eval: bool = False,
    phase: int | None = None,
) -> PackageResult:
    """Package a team's own train.py, its local imports, its checkpoint and a kit run's logs
    (``phase`` 2: with the inference.py beside train.py, checked against Phase 2's launch
    shapes and budget; None: the phase the run directory recorded, else Phase 1)."""
    train_py = Path(train_py)
    if not train_py.is_file():
        raise UsageError(f"--train-py {train_py}: no such file")
    given_launch = launch
    checkpoint, launch = _from_run_dir(run_dir, checkpoint, launch)
    if run_dir is None and (checkpoint.parent / "run" / SUMMARY_FILE).is_file():
        run_dir = checkpoint.parent / "run"  # where trnf init's train.py writes its run
    run_dir = Path(run_dir) if run_dir is not None else None
    rules = phase_rules(run_phase(run_dir, phase))
    try:
        launch = check_launch(launch, rules)
    except UsageError:
        if given_launch is not None or run_dir is None or rules.number == DEFAULT_PHASE:
            raise
        # A Phase 2 run rehearses at a scale a CPU (or a few chips) holds: its launch.txt is that one.
        raise UsageError(
            f"{run_dir / fmt.LAUNCH_FILE} records the launch the run rehearsed, {launch.strip()!r}, not a Phase "
            f"{rules.number} one; give --launch with the one the organisers will run ({rules.shapes_text()})"
        ) from None
    team_text = read_team_text(writeup)
    if team_text is None and run_dir is not None:  # the write-up the kit run left, as the team edited it
        team_text = existing_team_text(run_dir)
    members: dict[str, Path | bytes] = {
        fmt.TRAIN_PY: train_py,
        fmt.LAUNCH_FILE: (launch + "\n").encode(),
    }
    for name, path in imported_files(train_py).items():
        members[name] = path
    if rules.inference_py:
        inference = train_py.parent / fmt.INFERENCE_PY
        if not inference.is_file():
            raise UsageError(f"Phase {rules.number} submissions carry {fmt.INFERENCE_PY} beside train.py; {inference} does not exist (`trnf init {inference.parent} --inference-only` writes one)")
        members[fmt.INFERENCE_PY] = inference
        members.update(imported_files(inference))
    if checkpoint.is_file():
        check_checkpoint(checkpoint, run_dir)
    ckpt_members, params, non_finite = checkpoint_members(checkpoint)
    members.update(ckpt_members)

    summary = _kit_summary(members, run_dir, train_py, checkpoint, val_bpb_from_eval)

    step_log = members[fmt.STEP_LOG]
    reasons = refusal_reasons(
        summary,
        load_pins(pins_file),
        non_finite,
        step_log=step_log if isinstance(step_log, Path) else None,
        unmeasured="pass --val-bpb-from-eval, or --run-dir with a summary that has one",
        phase=rules,
    )
    forced = gate_members(members, reasons, force=force, what=str(train_py))

    facts = summary_facts(
        summary,
        name=train_py.parent.resolve().name,
        source=f"kit train.py {train_py.name}",
        launch=launch,
        kernels=[],
    )
    facts["params"] = params
    metrics_log = members[fmt.METRICS_LOG]
    add_writeup(
        members,
        facts,
        None,
        metrics_log if isinstance(metrics_log, Path) else None,
        forced,
        team_text,
    )
    measured_by = (
        "trnf package --val-bpb-from-eval (trusted evaluate_bpb)"
        if val_bpb_from_eval
        else summary.get("measured_by") or f"summary.json of the kit run {run_dir.name if run_dir else ''}"
    )
    meta = manifest_meta(
        summary, measured_by=measured_by, params=params, seed=summary.get("seed"), launch=launch, forced=forced,
        phase=rules.number,
    )
    return write_archive(members, meta, out)
