"""verify_archive: run every check on one archive, in order, and return the Report.

Order matters for safety: nothing from the archive executes until extraction, the
manifest, launch.txt, the static screen, the size limit and the checkpoint have passed. The contract probe,
``--rerun-eval`` and ``--dry-run`` (the only steps that run archive code, each in a
subprocess with a time limit) are skipped, with the reason, when any of those failed.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from trnfrontier import submission as fmt
from trnfrontier.errors import TrnfError
from trnfrontier.runtime.budget_rule import BUDGET_SECONDS
from trnfrontier.verify.archive import ExtractionError, Limits, safe_extract
from trnfrontier.verify.budget import BudgetLogError, account
from trnfrontier.verify.checkpoint import CheckpointError, scan_final_pt, scan_safetensors
from trnfrontier.verify.dryrun import DRY_RUN_STEPS_ENV, dry_run
from trnfrontier.verify.launch import Launch, LaunchError, parse_launch
from trnfrontier.verify.manifest import check_manifest, load_manifest
from trnfrontier.verify.pins import Pin, load_pins
from trnfrontier.verify.probe_process import run_probe
from trnfrontier.verify.report import Check, Report, failed, passed, skipped
from trnfrontier.verify.screen import screen_files

RERUN_TOLERANCE = 1e-4
# The contract probe does a few small forwards; the re-evaluation gets the organisers'
# evaluation limit (EVAL_TIMEOUT_SECONDS = 1200) plus time to import and load on a CPU.
DEFAULT_TIMEOUTS = {"contract": 300.0, "rerun-eval": 1500.0, "dry-run": 900.0}
# Every check, in report order; the ones after GATE run archive code.
CHECK_NAMES = ("extract", "manifest", "pin:prepare", "pin:tokenizer", "launch", "screen", "upload-size", "checkpoint", "budget", "contract")
# A failure here marks the archive as malformed or hostile, so none of its code runs.
# (A pin or budget failure does not: the contract result is still worth reporting.)
GATE = ("manifest", "launch", "screen", "upload-size", "checkpoint")


@dataclass
class Options:
    rerun_eval: bool = False
    dry_run: bool = False
    pins_file: Path | None = None
    # Seconds per subprocess; None gives each its own default (DEFAULT_TIMEOUTS).
    timeout: float | None = None
    dry_run_steps: int = 3
    limits: Limits = field(default_factory=Limits)

    def limit(self, check: str) -> float:
        return self.timeout if self.timeout is not None else DEFAULT_TIMEOUTS[check]


@dataclass
class _Trusted:
    module: ModuleType | None
    path: Path | None
    why_missing: str = ""


def _trusted_prepare() -> _Trusted:
    from trnfrontier.trusted_prepare import load_contract

    try:
        contract = load_contract()
    except TrnfError as exc:
        return _Trusted(None, None, str(exc))
    return _Trusted(contract.module, contract.path)


def _pin_check(name: str, pin: Pin, claimed: Any, *, required: bool) -> Check:
    if pin.sha256 is None:
        return skipped(name, pin.source, required=required) if not required else failed(name, pin.source)
    if not pin.matches(claimed):
        return failed(name, f"manifest has {str(claimed)[:16]}..., pinned {pin.sha256[:16]}... ({pin.source})")
    return passed(name, f"{pin.sha256[:16]}... matches ({pin.source})")


def _launch_check(root: Path, manifest: dict[str, Any] | str) -> tuple[Check, Launch | None]:
    path = fmt.member_path(root, fmt.LAUNCH_TXT)
    if not path.is_file():
        return failed("launch", "launch.txt is missing"), None
    try:
        text = path.read_text(encoding="utf-8")
        launch = parse_launch(text)
    except UnicodeDecodeError:
        return failed("launch", "launch.txt is not UTF-8 text"), None
    except LaunchError as exc:
        return failed("launch", str(exc)), None
    if isinstance(manifest, dict) and str(manifest.get("launch", "")).strip() != text.strip():
        return failed("launch", "launch.txt differs from the manifest's launch"), None
    return passed("launch", f"LNC={launch.lnc}, nproc_per_node={launch.nproc}"), launch


def _checkpoint_check(root: Path, manifest: dict[str, Any] | str) -> Check:
    try:
        st = scan_safetensors(fmt.member_path(root, fmt.CHECKPOINT_SAFETENSORS))
        pt = scan_final_pt(fmt.member_path(root, fmt.CHECKPOINT_FINAL_PT))
    except FileNotFoundError as exc:
        return failed("checkpoint", f"{Path(exc.filename or '').name or 'a checkpoint file'} is missing")
    except CheckpointError as exc:
        return failed("checkpoint", str(exc))
    bad = st.non_finite + [f"final.pt:{n}" for n in pt.non_finite]
    if bad:
        return failed("checkpoint", f"NaN or inf in {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}")
    if st.params != pt.params:
        return failed("checkpoint", f"model.safetensors has {st.params} parameters, final.pt {pt.params}")
    claimed = manifest.get("params") if isinstance(manifest, dict) else None
    if claimed != st.params:
        return failed("checkpoint", f"manifest claims {claimed} parameters, the checkpoint has {st.params}")
    return passed("checkpoint", f"{st.params:,} parameters in {st.tensors} tensors, all finite; final.pt loads with weights_only=True")


def _budget_check(root: Path, prepare: ModuleType | None) -> Check:
    path = fmt.member_path(root, fmt.STEP_LOG)
    if not path.is_file():
        return failed("budget", "logs/step_boundaries.jsonl is missing")
    try:
        acct, how = account(path, prepare)
    except (BudgetLogError, ValueError, KeyError, TypeError) as exc:
        return failed("budget", f"{fmt.STEP_LOG} unusable: {str(exc).replace(str(path), fmt.STEP_LOG)}")
    charged = float(acct["charged_seconds"])
    excluded = float(acct.get("excluded_seconds", acct["startup_seconds"]))
    line = f"charged {charged:.1f} s of {float(acct.get('budget_seconds', BUDGET_SECONDS)):g} ({excluded:.1f} s startup excluded), {int(acct['steps'])} steps, by {how}"
    if acct["over_budget"]:
        return failed("budget", "over budget: " + line)
    return passed("budget", line)


def _contract_check(root: Path, trusted: _Trusted, options: Options) -> Check:
    result = run_probe("contract", root=root, checkpoint=fmt.member_path(root, fmt.EVAL_CHECKPOINT), prepare=trusted.path, timeout=options.limit("contract"))
    if result.data is None:
        return failed("contract", f"load_for_eval probe {result.error}")
    if "error" in result.data:
        return failed("contract", f"load_for_eval or forward failed: {result.data['error']}")
    checks: dict[str, dict[str, Any]] = result.data["checks"]
    bad = [f"{name}: {c['detail']}" for name, c in checks.items() if not c["passed"]]
    if bad:
        return failed("contract", "; ".join(bad))
    return passed("contract", "causal, batch-independent, deterministic, eval mode, no hooks, finite logits")


def _rerun_check(root: Path, manifest: dict[str, Any], trusted: _Trusted, options: Options) -> Check:
    if trusted.module is None or not callable(getattr(trusted.module, "evaluate_bpb", None)):
        return failed("rerun-eval", f"no trusted evaluate_bpb to rerun ({trusted.why_missing or 'prepare.py lacks evaluate_bpb'})")
    claimed = manifest.get("claimed") or {}
    try:
        claimed_bpb = float(claimed["val_bpb"])
        tokens, seq_len = int(claimed["eval_tokens"]), int(claimed["eval_seq_len"])
    except (KeyError, TypeError, ValueError):
        return failed("rerun-eval", "manifest claimed needs val_bpb, eval_tokens and eval_seq_len")
    if claimed.get("split", "public_val") not in ("public_val", "val"):
        return failed("rerun-eval", f"claimed split {claimed.get('split')!r} is not the public validation split")
    result = run_probe(
        "eval", root=root, checkpoint=fmt.member_path(root, fmt.EVAL_CHECKPOINT), prepare=trusted.path,
        timeout=options.limit("rerun-eval"), extra=["--seq-len", str(seq_len), "--eval-tokens", str(tokens)],
    )
    if result.data is None:
        return failed("rerun-eval", f"evaluation {result.error}")
    if "error" in result.data:
        return failed("rerun-eval", f"evaluation failed: {result.data['error']}")
    got = float(result.data["eval"]["val_bpb"])
    diff = abs(got - claimed_bpb)
    line = f"trusted evaluate_bpb gives {got:.6f}, claimed {claimed_bpb:.6f} (|diff| {diff:.2g}, tol {RERUN_TOLERANCE:g}; {tokens} tokens, seq {seq_len})"
    return passed("rerun-eval", line) if diff <= RERUN_TOLERANCE else failed("rerun-eval", line)


def verify_archive(archive: Path, options: Options | None = None) -> Report:
    """Verify ``archive``; every outcome, hostile input included, is a Report, never an exception."""
    options = options or Options()
    report = Report(archive=str(archive))
    pins = load_pins(options.pins_file)  # a bad pins file is a usage problem: raise before any work
    with tempfile.TemporaryDirectory(prefix="trnf-verify-") as tmp:
        root = Path(tmp) / "archive"
        root.mkdir()
        try:
            extracted = safe_extract(archive, root, options.limits)
        except ExtractionError as exc:
            report.add(failed("extract", str(exc)))
            requested = [n for n, on in (("rerun-eval", options.rerun_eval), ("dry-run", options.dry_run)) if on]
            for name in [*CHECK_NAMES[1:], *requested]:
                report.add(skipped(name, "not checked: the archive was not extracted"))
            return report
        names = sorted(extracted.files)
        total = sum(int(e["size"]) for e in extracted.files.values())  # type: ignore[call-overload]
        report.add(passed("extract", f"{len(names)} files, {total:,} bytes, no links, devices or escaping paths"))

        manifest = load_manifest(root)
        report.add(check_manifest(manifest, extracted.files))
        meta = manifest if isinstance(manifest, dict) else {}
        report.add(_pin_check("pin:prepare", pins.prepare, meta.get("prepare_sha256"), required=True))
        report.add(_pin_check("pin:tokenizer", pins.tokenizer, meta.get("tokenizer_sha256"), required=pins.tokenizer.sha256 is not None))
        launch_check, launch = _launch_check(root, manifest)
        report.add(launch_check)

        findings, _ = screen_files(root, names)
        if findings:
            more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
            report.add(failed("screen", f"{findings[0]}{more}"))
        else:
            report.add(passed("screen", f"{sum(n.endswith('.py') for n in names)} .py files: allowed imports only, no network/process use, no validation data, prepare untouched, load_for_eval defined"))
        over = [f"{n} ({extracted.files[n]['size']:,} B)" for n in fmt.code_members(names) if int(extracted.files[n]["size"]) > fmt.PORTAL_FILE_LIMIT_BYTES]  # type: ignore[call-overload]
        report.add(
            failed("upload-size", f"over the portal's {fmt.PORTAL_FILE_LIMIT_BYTES:,}-byte limit: {', '.join(over)}")
            if over
            else passed("upload-size", f"every uploaded code file is under {fmt.PORTAL_FILE_LIMIT_BYTES:,} bytes")
        )
        report.add(_checkpoint_check(root, manifest))
        trusted = _trusted_prepare()
        report.add(_budget_check(root, trusted.module))
        if meta.get("forced"):
            report.notes.append(f"packaged with --force: {json.dumps(meta['forced'])}")

        blocked = [name for name in GATE if not report.get(name) or report.get(name).verdict != "pass"]  # type: ignore[union-attr]
        why = f"not run: archive code executes only after {', '.join(blocked)} pass"
        report.add(skipped("contract", why) if blocked else _contract_check(root, trusted, options))
        if options.rerun_eval:
            report.add(skipped("rerun-eval", why) if blocked else _rerun_check(root, meta, trusted, options))
        if options.dry_run:
            if blocked or launch is None:
                report.add(skipped("dry-run", why))
            else:
                work = Path(tmp) / "dry-run"
                work.mkdir()
                res = dry_run(root, names, work, nproc=launch.nproc, lnc=launch.lnc, prepare=trusted.path, steps=options.dry_run_steps, timeout=options.limit("dry-run"))
                report.add(passed("dry-run", res.reason) if res.passed else failed("dry-run", res.reason))
                report.notes.append(f"dry run: train.py is expected to honour {DRY_RUN_STEPS_ENV}, TRNF_DEVICE=cpu and TRNF_DIST_BACKEND=gloo")
    return report
