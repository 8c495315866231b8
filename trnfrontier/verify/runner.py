"""verify_archive: run every check on one archive, in order, and return the Report.

Order matters for safety. The trusted prepare.py is loaded, and its scoring functions
captured, before the archive is even opened. Nothing from the archive executes until
extraction, the manifest, launch.txt, the static screen, the size limit and the
checkpoint have passed; the contract probe, ``--rerun-eval`` and ``--dry-run`` (the only
steps that run archive code) are skipped, with the reason, when any of those failed.
Archive code runs only inside the sandbox (``sandbox.py``, bubblewrap); where there is
none, those checks fail with the reason unless ``allow_unsandboxed`` is set, and the
report's first line (``Report.sandbox``) says which of the three happened.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from trnfrontier import submission as fmt
from trnfrontier.contract.budget import (
    account,
    cross_check,
    for_phase,
    recorded_start,
    resumed_charge,
    trainer_log_charge,
)
from trnfrontier.contract.checkpoint import (
    CheckpointError,
    first_difference,
    scan_final_pt,
    scan_safetensors,
)
from trnfrontier.contract.jsonstrict import StrictJSONError, check_jsonl, strict_loads
from trnfrontier.contract.launch import Launch, LaunchError, parse_launch
from trnfrontier.contract.phases import DEFAULT_PHASE, PHASES, Phase, phase_of
from trnfrontier.contract.pins import Pin, load_pins
from trnfrontier.contract.steplog import HEADER, StepLogError, read_step_log
from trnfrontier.errors import TrnfError
from trnfrontier.kit.harness import DRY_RUN_STEPS_ENV, dry_run_ranks
from trnfrontier.progress import Steps
from trnfrontier.runtime.budget_rule import BUDGET_SECONDS
from trnfrontier.untrusted import hostfs, sandbox
from trnfrontier.untrusted.served import ServedModel, ServerError, remote_module
from trnfrontier.verify.archive import Extracted, ExtractionError, Limits, safe_extract
from trnfrontier.verify.claims import ClaimError, RerunSettings, parse_claim, settings_mismatch
from trnfrontier.verify.dryrun import dry_run
from trnfrontier.verify.identity import checkpoint_shapes
from trnfrontier.verify.manifest import check_manifest, load_manifest
from trnfrontier.verify.report import Check, Report, failed, passed, skipped
from trnfrontier.verify.rerun import closing_all, confirm
from trnfrontier.verify.scoring import VOCAB_SLACK, TrustedScorer, contract_checks
from trnfrontier.verify.screen import screen_files
from trnfrontier.verify.statements import MetaJsonError, read_meta_json, stated_over_budget

DRY_RUN_NOTE_CHARS = 1500
# The contract probe does a few small forwards; the re-evaluation gets the organisers'
# evaluation limit (EVAL_TIMEOUT_SECONDS = 1200) plus time to import and load on a CPU.
DEFAULT_TIMEOUTS = {"contract": 300.0, "rerun-eval": 1500.0, "dry-run": 900.0, "inference": 900.0, "core": 3600.0}
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
    # Run archive code without bubblewrap where it is unavailable (the report says so first).
    allow_unsandboxed: bool = False
    # The contract probe's random cut points and rows; a fresh one per run unless given, printed in
    # the report so the probe can be repeated. The scored pass never uses it (MixedPass draws 256
    # secret bits of its own): a seed a model could recover would tell it every check row.
    seed: int = field(default_factory=lambda: secrets.randbelow(1 << 31))
    # Set by verify_archive from sandbox.available().
    sandboxed: bool = True
    # Phase 2: the CORE bundle the inference check scores a few items of (evaluate/core/fetch.py
    # specs: a folder, zip, URL, pin file or "sample", the shipped format sample).
    core_bundle: str = "sample"
    # `--core`: also score CORE on the archive's model (evaluate.core.job.prepare_core).
    core: Any = None

    # The rerun's evaluation settings; None: the contract's (RerunSettings.of).
    eval_tokens: int | None = None
    eval_seq_len: int | None = None

    def limit(self, check: str) -> float:
        return self.timeout if self.timeout is not None else DEFAULT_TIMEOUTS[check]

    def settings(self, prepare: ModuleType | None) -> RerunSettings:
        return RerunSettings.of(prepare, tokens=self.eval_tokens, seq_len=self.eval_seq_len)


@dataclass
class _Trusted:
    module: ModuleType | None
    path: Path | None
    why_missing: str = ""
    scorer: TrustedScorer | None = None


def _trusted_prepare() -> _Trusted:
    """The trusted prepare.py, its scoring functions captured now, before any archive code runs."""
    from trnfrontier.trusted_prepare import load_contract

    try:
        contract = load_contract()
    except TrnfError as exc:
        return _Trusted(None, None, str(exc))
    return _Trusted(contract.module, contract.path, scorer=TrustedScorer.capture(contract.module, contract.path))


def _pin_check(name: str, pin: Pin, claimed: Any, *, required: bool) -> Check:
    if pin.sha256 is None:
        return skipped(name, pin.source, required=required) if not required else failed(name, pin.source)
    if not pin.matches(claimed):
        return failed(name, f"manifest has {str(claimed)[:16]}..., pinned {pin.sha256[:16]}... ({pin.source})")
    return passed(name, f"{pin.sha256[:16]}... matches ({pin.source})")


def _launch_check(root: Path, manifest: dict[str, Any] | str, phase: Phase) -> tuple[Check, Launch | None]:
    path = fmt.member_path(root, fmt.LAUNCH_FILE)
    if not path.is_file():
        return failed("launch", "launch.txt is missing"), None
    try:
        text = path.read_text(encoding="utf-8")
        launch = parse_launch(text, phase)
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
    try:
        differs = first_difference(fmt.member_path(root, fmt.CHECKPOINT_SAFETENSORS), fmt.member_path(root, fmt.CHECKPOINT_FINAL_PT))
    except Exception as exc:  # noqa: BLE001 - hostile bytes raise anything; every one means "cannot compare"
        differs = f"the two cannot be compared ({type(exc).__name__}: {str(exc)[:120]})"
    if differs:
        return failed("checkpoint", f"final.pt and model.safetensors disagree: {differs}")
    try:
        read_meta_json(root)
    except MetaJsonError as exc:
        return failed("checkpoint", str(exc))
    return passed("checkpoint", f"{st.params:,} parameters in {st.tensors} tensors, all finite, final.pt equal to model.safetensors; final.pt loads with weights_only=True")


# What verify reads of an archive's logs, at most (a real 30-minute run's are a few MB).
LOG_CAP_BYTES = 64 << 20


def _member_bytes(root: Path, name: str, cap: int = LOG_CAP_BYTES) -> bytes | None:
    """A member verify extracted (a regular file it wrote itself), at most ``cap`` bytes; None when absent."""
    path = fmt.member_path(root, name)
    if not path.is_file():
        return None
    size = path.stat().st_size
    if size > cap:
        raise StrictJSONError(f"{name} is {size:,} bytes, over the {cap:,}-byte limit for it")
    return path.read_bytes()


def _summary(root: Path) -> dict[str, Any] | str:
    """logs/summary.json as a dict, or why it cannot be read (strictly: no duplicate keys, bounded depth and numbers)."""
    try:
        data = _member_bytes(root, fmt.SUMMARY, 4 << 20)
        parsed = {} if data is None else strict_loads(data, what=fmt.SUMMARY)
    except StrictJSONError as exc:
        return str(exc)
    return parsed if isinstance(parsed, dict) else f"{fmt.SUMMARY} is not a JSON object"


def _logs_readable(root: Path) -> str | None:
    """Why the step log or the trainer log cannot be read strictly (UTF-8, bounded lines, bounded finite
    numbers, the field named), or None. Only then do the contract's parsers see them."""
    try:
        for name in (fmt.STEP_LOG, fmt.METRICS_LOG):
            data = _member_bytes(root, name)
            if data is not None:
                # NaN and Infinity are the step-log reader's to name (a non-finite start time, ...).
                check_jsonl(data, what=name, json_only=False, constants=True, keep=False)
    except StrictJSONError as exc:
        return str(exc)
    return None


def _budget_check(root: Path, prepare: ModuleType | None, phase: Phase) -> Check:
    """The step log under the organisers' accounting, cross-checked with the summary and the trainer log."""
    path = fmt.member_path(root, fmt.STEP_LOG)
    if not path.is_file():
        return failed("budget", "logs/step_boundaries.jsonl is missing")
    unreadable = _logs_readable(root)
    if unreadable:
        return failed("budget", unreadable)
    try:
        return _budget_from_logs(root, path, prepare, phase)
    except Exception as exc:  # noqa: BLE001 - a log the parser refuses in its own words: a refusal, never a traceback
        return failed("budget", f"{fmt.STEP_LOG} unusable: {type(exc).__name__}: {str(exc).replace(str(path), fmt.STEP_LOG)}")


def _budget_from_logs(root: Path, path: Path, prepare: ModuleType | None, phase: Phase) -> Check:
    summary = _summary(root)
    if isinstance(summary, str):
        return failed("budget", summary)
    launch, source = recorded_start(summary)  # a log without a header line starts at the recorded launch
    try:
        log = read_step_log(path, launch, source)
        acct, how = account(path, prepare, launch, source)
        acct, how = for_phase(acct, how, phase, log, prepare)
    except (StepLogError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return failed("budget", f"{fmt.STEP_LOG} unusable: {str(exc).replace(str(path), fmt.STEP_LOG)}")
    if log.lower_bound:
        return failed("budget", f"{fmt.STEP_LOG} gives each step's duration only ({log.describe()}): it cannot show the run kept to the budget")
    budget = float(acct.get("budget_seconds", BUDGET_SECONDS))
    charged = float(acct["charged_seconds"])
    excluded = float(acct.get("excluded_seconds", acct["startup_seconds"]))
    line = f"charged {charged:.1f} s of {budget:g} ({excluded:.1f} s startup excluded), {int(acct['steps'])} steps, by {how}"
    if log.start_source != HEADER:  # say where the start came from when the log did not say it
        line += f"; start time from {log.start_source}"
    if len(log.segments) > 1:
        charged = resumed_charge(log, prepare)
        line = f"resumed run: {len(log.segments)} segments charged {charged:.1f} s of {budget:g} in all (startup excluded once)"
    if acct["over_budget"] or charged > budget:
        return failed("budget", "over budget: " + line)
    stated = stated_over_budget(root, summary, budget)
    if stated:
        return failed("budget", f"the archive says the run went over budget: {stated} ({line})")
    disagreement = cross_check(charged, budget, len(log.segments), summary, trainer_log_charge(fmt.member_path(root, fmt.METRICS_LOG)))
    if disagreement:
        return failed("budget", f"{disagreement} ({line})")
    return passed("budget", line + "; summary and trainer log agree")


def _claimed_seq_len(meta: dict[str, Any], trusted: _Trusted, options: Options) -> int:
    """The length the claim was measured at, read strictly (``claims.parse_claim``), else the rerun's."""
    try:
        return parse_claim(meta.get("claimed")).eval_seq_len
    except ClaimError:
        return options.settings(trusted.module).seq_len


def _serve(root: Path, trusted: _Trusted, options: Options, scratch: Path, check: str, count: int = 1) -> list[ServedModel]:
    """The archive's model in ``count`` fresh, identical servers. Sandboxed, each one's home is a
    private tmpfs and ``scratch`` is not created; unsandboxed (``--allow-unsandboxed``) each gets a
    host directory under it."""
    scratches: tuple[Path | None, ...] = ()
    if not options.sandboxed:
        scratch.mkdir()
        scratches = tuple(scratch / f"s{i}" for i in range(count))
        for path in scratches:
            path.mkdir()  # type: ignore[union-attr]
    servers = ServedModel.start_all(count, root=root, checkpoint=fmt.member_path(root, fmt.EVAL_CHECKPOINT), prepare=trusted.path,
                                    timeout=options.limit(check), sandboxed=options.sandboxed, scratches=scratches)
    if trusted.scorer is not None:  # no reply wider than the vocabulary + a little (CORE, the probe, the rerun)
        for served in servers:
            served.vocab_limit = trusted.scorer.vocab + VOCAB_SLACK
    return servers


def _scratch(tmp: Path) -> Path:
    """A server's scratch under ``tmp`` (used only by an unsandboxed run, where it is the server's HOME):
    a random name, so that no model can tell the rerun's servers from the probe's by their HOME."""
    return tmp / f"scratch-{secrets.token_hex(6)}"


def _contract_check(root: Path, trusted: _Trusted, options: Options, scratch: Path) -> Check:
    seq_len = options.settings(trusted.module).seq_len
    vocab = trusted.scorer.vocab if trusted.scorer else 8192
    try:
        with closing_all(_serve(root, trusted, options, scratch, "contract")) as (served,):
            checks = contract_checks(served, vocab=vocab, seq_len=seq_len, seed=options.seed,
                                     checkpoint=fmt.member_path(root, fmt.CHECKPOINT_SAFETENSORS))
    except ServerError as exc:
        return failed("contract", f"load_for_eval or forward failed (in the sandbox): {exc}")
    bad = [f"{name}: {c['detail']}" for name, c in checks.items() if not c["passed"]]
    if bad:
        return failed("contract", "; ".join(bad))
    return passed("contract", f"causal ({checks['causal']['detail']}), batch-independent ({checks['batch_independent']['detail']}), "
                              f"deterministic, eval mode, no hooks, finite logits, prepare untouched; {checks['checkpoint']['detail']}; "
                              f"seed {options.seed}")


def _rerun_check(root: Path, names: list[str], manifest: dict[str, Any], trusted: _Trusted, options: Options, scratch: Path,
                 contract: Check) -> Check:
    scorer = trusted.scorer
    if scorer is None or not callable(scorer.evaluate_bpb) or not callable(scorer.ensure_tokenizer):
        return failed("rerun-eval", f"no trusted evaluate_bpb to rerun ({trusted.why_missing or 'prepare.py lacks evaluate_bpb'})")
    try:
        claim = parse_claim(manifest.get("claimed"))
    except ClaimError as exc:
        return failed("rerun-eval", f"manifest.json: {exc}")
    settings = options.settings(trusted.module)
    mismatch = settings_mismatch(claim, settings)
    if mismatch:
        return failed("rerun-eval", mismatch)
    if contract.verdict != "pass":
        # A score is confirmed only for a model that keeps the contract (an acausal model's
        # rerun reproduces its own inflated score).
        return failed("rerun-eval", "refused: the contract probe failed, and a score from a model that breaks the contract is not confirmed")
    try:
        tokenizer = scorer.tokenizer()  # before the server starts: no data, no point
    except Exception as exc:  # noqa: BLE001 - the trusted file's own errors (no prepared dataset, ...)
        return failed("rerun-eval", f"evaluation failed: {type(exc).__name__}: {exc}")
    try:
        rerun = confirm(claim, settings, scorer, tokenizer, lambda: closing_all(_serve(root, trusted, options, scratch, "rerun-eval", 2)),
                        checkpoint=fmt.member_path(root, fmt.CHECKPOINT_SAFETENSORS), root=root, names=names)
    except ServerError as exc:
        return failed("rerun-eval", f"evaluation failed: {exc}")
    except Exception as exc:  # noqa: BLE001 - the trusted scorer's own errors on what the model returned
        return failed("rerun-eval", f"evaluation failed: {type(exc).__name__}: {exc}")
    return passed("rerun-eval", rerun.line) if rerun.ok else failed("rerun-eval", rerun.line)


def _core_check(report: Report, root: Path, meta: dict[str, Any], trusted: _Trusted, options: Options, scratch: Path) -> Check:
    """CORE (evaluate.core) in verify's process on logits the sandboxed model returns; the
    crop is the length the archive claims it was evaluated at."""
    import torch

    from trnfrontier.evaluate.core.run import CoreOptions, evaluate_core

    scorer = trusted.scorer
    if scorer is None or not callable(scorer.ensure_tokenizer):
        return failed("core", f"no trusted tokenizer ({trusted.why_missing or 'prepare.py lacks ensure_tokenizer'})")
    setup, crop = options.core, _claimed_seq_len(meta, trusted, options)
    core_options = CoreOptions(max_per_task=setup.max_per_task, crop=crop, crop_source="the archive's claimed eval_seq_len",
                               batch_tokens=setup.batch_tokens)
    try:
        tokenizer = scorer.tokenizer()
        with closing_all(_serve(root, trusted, options, scratch, "core")) as (served,):
            result = evaluate_core(setup.resolved, remote_module(served), tokenizer, torch.device("cpu"), core_options)
    except ServerError as exc:
        return failed("core", f"CORE failed: {exc}")
    except TrnfError as exc:
        return failed("core", f"CORE: {exc}")
    except Exception as exc:  # noqa: BLE001 - the model's own failures under CORE, as logits it returned
        return failed("core", f"CORE failed: {type(exc).__name__}: {exc}")
    report.core = result
    full = "" if result["full_metric"] else f" (--max-per-task {result['max_per_task']}: NOT the full metric)"
    return passed("core", f"CORE {result['core_metric']:.4f}{full} over {len(result['tasks'])} tasks, "
                          f"{sum(t['items'] for t in result['tasks'].values()):,} items, {result['near_ties']} near-tie(s), "
                          f"bundle {result['bundle_sha256'][:12]}, crop {crop}")


def _sandbox_line(options: Options) -> tuple[str, str | None]:
    """The report's first line about the sandbox, and why archive code may not run (None: it may)."""
    state = sandbox.available()
    if state.ok:
        options.sandboxed = True
        return f"sandbox: {state.detail}; {sandbox.limits_line()}", None
    options.sandboxed = False
    if options.allow_unsandboxed:
        return f"NOT SANDBOXED (--allow-unsandboxed): archive code ran on this machine without isolation; {state.detail}", None
    return (f"NO SANDBOX: archive code was not run; {state.detail}",
            f"refused: no sandbox to run archive code in ({state.detail}); install bubblewrap, or pass --allow-unsandboxed to run it without isolation")


def _static_checks(report: Report, root: Path, extracted: Extracted, pins: Any, trusted: _Trusted) -> tuple[dict[str, Any], Launch | None]:
    """Every check that reads the archive without running any of it."""
    names = sorted(extracted.files)
    manifest = load_manifest(root)
    report.add(check_manifest(manifest, extracted.files))
    meta = manifest if isinstance(manifest, dict) else {}
    report.add(_pin_check("pin:prepare", pins.prepare, meta.get("prepare_sha256"), required=True))
    report.add(_pin_check("pin:tokenizer", pins.tokenizer, meta.get("tokenizer_sha256"), required=pins.tokenizer.sha256 is not None))
    try:
        phase = phase_of(meta)
    except ValueError as exc:
        phase = PHASES[DEFAULT_PHASE]
        report.add(failed("manifest", f"manifest {exc}"))
    launch_check, launch = _launch_check(root, manifest, phase)
    report.add(launch_check)
    findings, _ = screen_files(root, names)
    if findings:
        more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
        report.add(failed("screen", f"{findings[0]}{more}"))
    else:
        report.add(passed("screen", f"{sum(n.endswith('.py') for n in names)} .py files: a fast first filter (allowed imports, no network/process use, no validation data, prepare untouched, load_for_eval defined); the sandbox is the boundary"))
    over = [f"{n} ({extracted.files[n]['size']:,} B)" for n in fmt.code_members(names) if int(extracted.files[n]["size"]) > fmt.PORTAL_FILE_LIMIT_BYTES]  # type: ignore[call-overload]
    report.add(
        failed("upload-size", f"over the portal's {fmt.PORTAL_FILE_LIMIT_BYTES:,}-byte limit: {', '.join(over)}")
        if over
        else passed("upload-size", f"every uploaded code file is under {fmt.PORTAL_FILE_LIMIT_BYTES:,} bytes")
    )
    report.add(_checkpoint_check(root, manifest))
    report.add(_budget_check(root, trusted.module, phase))
    if meta.get("forced"):
        report.note(f"packaged with --force: {json.dumps(meta['forced'])}")
    return meta, launch


def progress_units(options: Options) -> int:
    """Units of progress ``verify_archive`` reports: the static checks, then each executing one."""
    return 2 + int(options.rerun_eval) + int(options.dry_run) + int(options.core is not None)


def _executing_checks(report: Report, tmp: Path, root: Path, names: list[str], meta: dict[str, Any], launch: Launch | None,
                      trusted: _Trusted, options: Options, refusal: str | None, bar: Steps) -> None:
    """The checks that run archive code, each inside the sandbox, only once the gate has passed."""
    blocked = [name for name in GATE if not report.get(name) or report.get(name).verdict != "pass"]  # type: ignore[union-attr]
    phase = _phase(meta)
    wanted = (("rerun-eval", options.rerun_eval), ("core", options.core is not None), ("dry-run", options.dry_run),
              ("inference", phase.inference_py))
    requested = ["contract"] + [n for n, on in wanted if on]
    if blocked:
        for name in requested:
            report.add(skipped(name, f"not run: archive code executes only after {', '.join(blocked)} pass"))
        return
    if refusal is not None:
        for name in requested:
            report.add(failed(name, refusal))
        return
    bar.describe("contract probe: the archive's model served from the sandbox")
    contract = report.add(_contract_check(root, trusted, options, _scratch(tmp)))
    bar.advance()
    if options.rerun_eval:
        bar.describe("re-running the trusted evaluate_bpb on the archive's checkpoint")
        report.add(_rerun_check(root, names, meta, trusted, options, _scratch(tmp), contract))
        bar.advance()
    if options.core is not None:
        bar.describe("CORE on the archive's model served from the sandbox")
        report.add(_core_check(report, root, meta, trusted, options, _scratch(tmp)) if contract.verdict == "pass"
                   else failed("core", "refused: the contract probe failed, and CORE of a model that breaks the contract means nothing"))
        bar.advance()
    if options.dry_run:
        bar.describe(f"dry run: train.py for {options.dry_run_steps} steps under torchrun in the sandbox")
        report.add(_dry_run_check(report, root, names, tmp / "dry-run", launch, phase, trusted, options))
        report.note(f"dry run: train.py is expected to honour {DRY_RUN_STEPS_ENV}, TRNF_DEVICE=cpu and TRNF_DIST_BACKEND=gloo")
    if phase.inference_py:
        bar.describe("inference.py: its log-probabilities against load_for_eval's, and a few CORE items through it")
        for check in _inference_checks(root, meta, launch, phase, trusted, options, _scratch(tmp), contract):
            report.add(check)


def _dry_run_check(report: Report, root: Path, names: list[str], work: Path, launch: Launch | None, phase: Phase,
                   trusted: _Trusted, options: Options) -> Check:
    if launch is None:
        return skipped("dry-run", "not run: launch.txt did not parse")
    work.mkdir()
    nproc = dry_run_ranks(launch.nproc, phase)  # Phase 2's 64 or 128 ranks do not fit a CPU
    res = dry_run(root, names, work, nproc=nproc, lnc=launch.lnc, prepare=trusted.path, steps=options.dry_run_steps,
                  timeout=options.limit("dry-run"), sandboxed=options.sandboxed,
                  expected=checkpoint_shapes(fmt.member_path(root, fmt.CHECKPOINT_SAFETENSORS)))
    if not res.passed and res.output.strip():
        report.note(f"dry run output (its last part): {res.output[-DRY_RUN_NOTE_CHARS:]}")
    return passed("dry-run", res.reason) if res.passed else failed("dry-run", res.reason)


def _phase(meta: dict[str, Any]) -> Phase:
    """The phase the manifest declares (an unknown one was a manifest failure: Phase 1's rules)."""
    try:
        return phase_of(meta)
    except ValueError:
        return PHASES[DEFAULT_PHASE]


def _inference_checks(root: Path, meta: dict[str, Any], launch: Launch | None, phase: Phase, trusted: _Trusted,
                      options: Options, scratch: Path, contract: Check) -> list[Check]:
    """Phase 2: inference.py against load_for_eval, and its CORE time (verify/inference_check.py)."""
    from trnfrontier.verify.inference_check import InferenceSetup, inference_checks

    if contract.verdict != "pass":
        return [failed("inference", "refused: the contract probe failed, so load_for_eval is no reference to hold inference.py to")]
    bundle, tokenizer, problem = None, None, ""
    try:
        from trnfrontier.evaluate.core.fetch import resolve

        tokenizer = trusted.scorer.tokenizer() if trusted.scorer else None
        bundle = resolve(options.core_bundle) if tokenizer is not None else None
        problem = "" if tokenizer is not None else "no trusted tokenizer to render CORE items with"
    except Exception as exc:  # noqa: BLE001 - no bundle or no tokenizer: the consistency check still runs
        bundle, problem = None, f"CORE bundle {options.core_bundle!r}: {exc}"
    setup = InferenceSetup(root=root, prepare=trusted.path, scratch=scratch, timeout=options.limit("inference"),
                           sandboxed=options.sandboxed, seed=options.seed, tokenizer=tokenizer, bundle=bundle,
                           crop=_claimed_seq_len(meta, trusted, options), bundle_problem=problem,
                           vocab_limit=trusted.scorer.vocab + VOCAB_SLACK if trusted.scorer else None)
    return inference_checks(setup, phase, launch.nproc if launch else phase.launch_shapes[0].nproc)


def verify_archive(archive: Path, options: Options | None = None, progress: Steps | None = None) -> Report:
    """Verify ``archive``; every outcome, hostile input included, is a Report, never an exception.
    ``progress`` (``progress_units(options)`` in all) says which check is running."""
    options = options or Options()
    bar = progress or Steps.none()
    report = Report(archive=str(archive))
    pins = load_pins(options.pins_file)  # a bad pins file is a usage problem: raise before any work
    # The trusted prepare.py comes first: loaded and its scorer captured before the archive is read.
    trusted = _trusted_prepare()
    report.sandbox, refusal = _sandbox_line(options)
    bar.describe(f"checking {archive.name}: extraction, manifest, pins, screen, checkpoint, budget")
    with hostfs.private_dir("trnf-verify-") as tmp:
        root = tmp / "archive"
        root.mkdir()
        try:
            extracted = safe_extract(archive, root, options.limits)
        except ExtractionError as exc:
            report.add(failed("extract", str(exc)))
            requested = [n for n, on in (("rerun-eval", options.rerun_eval), ("dry-run", options.dry_run)) if on]
            for name in [*CHECK_NAMES[1:], *requested]:
                report.add(skipped(name, "not checked: the archive was not extracted"))
            return report
        total = sum(int(e["size"]) for e in extracted.files.values())  # type: ignore[call-overload]
        report.add(passed("extract", f"{len(extracted.files)} files, {total:,} bytes, no links, devices or escaping paths"))
        meta, launch = _static_checks(report, root, extracted, pins, trusted)
        bar.advance()
        _executing_checks(report, tmp, root, sorted(extracted.files), meta, launch, trusted, options, refusal, bar)
    return report
