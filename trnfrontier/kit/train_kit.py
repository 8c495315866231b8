"""`trnf train --train-py`: run a team's own train.py as the organisers would, and account for it.

Where things happen (decided so that a kit run behaves exactly like the organisers' run):

- The working directory is **train.py's own directory**: relative paths in the script
  (its kernel files, data) mean what they mean on the organisers' machine. Python puts that
  directory first on ``sys.path``, so a prepare.py there must be the trusted one (checked
  before launch).
- The checkpoint goes to a **folder of the run's own**: trnf sets the kit's
  ``NEURON_COMPETITION_R1_OUT_DIR`` to ``<run dir>/out`` unless the user chose the folder
  (``kit/out_dir.py``), so two runs of one script at once never share an ``out/final.pt``.
  A script that ignores the variable writes ``out/final.pt`` beside itself as before; the
  run finds it there and says the script ignores the knob. summary.json records where the
  checkpoint is, and its SHA256.
- Everything trnf writes goes to the **run directory** (``--out``, default
  ``runs/kit-<UTC time>``)::

      launch.txt                 the organisers' launch line (what a submission declares)
      out/final.pt               the checkpoint (train.py's output folder, NEURON_COMPETITION_R1_OUT_DIR)
      launch.json                the argv executed, its cwd and the environment trnf set
      train.py                   the script as launched (its SHA256 is in summary.json)
      contract/prepare.py        the trusted prepare.py, first on PYTHONPATH
      site/                      next on PYTHONPATH: trnf_exit_settle (trnfrontier.runtime.exit_settle)
      logs/console.log           torchrun's console (every rank, prefixed [defaultR]:)
      logs/rank<R>.stdout.log    each rank's own stdout / stderr
      logs/rank<R>.stderr.log
      step_boundaries.jsonl      TRNF_STEP_LOG: what record_step_boundary wrote
      metrics.jsonl              the step lines rank 0 printed, + charged_seconds
      summary.json               recipe-run keys + kit keys (see build below)

``--phase`` (``KitOptions.phase``, default 1) chooses the competition phase the run is held
to: its launch shapes (a shape outside them is a note, not a refusal: local rehearsals run at
other scales), its budget and startup rules (``contract/phases.py``), and for Phase 2 a note
when no inference.py is beside train.py. summary.json records it; `trnf package` follows it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnfrontier.child_env import child_env
from trnfrontier.contract.budget import account_log
from trnfrontier.contract.checkpoint import CheckpointError, scan_final_pt
from trnfrontier.contract.kit import CHECKPOINT as KIT_CHECKPOINT
from trnfrontier.contract.kit import ENV_PREFIX, LAUNCH_FILE, OUT_DIR_ENV
from trnfrontier.contract.kit import STEP_LOG_ENV as KIT_STEP_LOG_ENV
from trnfrontier.contract.launch import LNC_CHOICES, NPROC_CHOICES, choices_text
from trnfrontier.contract.phases import DEFAULT_PHASE, PHASES, Phase
from trnfrontier.contract.phases import phase as phase_rules
from trnfrontier.errors import UsageError
from trnfrontier.hints import trnf_line
from trnfrontier.kit import launch, logs, out_dir, preflight, summary
from trnfrontier.runtime import budget_rule, exit_settle, speed_env
from trnfrontier.runtime.atomic import atomic_write_json
from trnfrontier.runtime.budget_rule import BUDGET_SECONDS
from trnfrontier.runtime.prepare_loader import sha256_file
from trnfrontier.runtime.rundir import (
    COMPLETED,
    CRASHED,
    DIVERGED,
    EXIT_FAILED,
    INTERRUPTED,
    METRICS_FILE,
    STEP_LOG_ENV,
    STEP_LOG_FILE,
    SUMMARY_FILE,
    TIMED_OUT,
    exit_code_for,
    read_summary,
)
from trnfrontier.submission import INFERENCE_PY
from trnfrontier.trusted_prepare import TrustedContract, load_contract, recorded_tokenizer_sha256


class KitInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a kit run, after every process was stopped and the summary written."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(str(run_dir))
        self.run_dir = run_dir


@dataclass(frozen=True)
class KitOptions:
    train_py: Path
    nproc: int = 1
    lnc: int = 2
    out: Path | None = None
    timeout: float | None = None
    args: tuple[str, ...] = ()
    phase: int = DEFAULT_PHASE  # the competition phase whose launch shapes and budget the run is held to


@dataclass
class KitRun:
    run_dir: Path
    summary: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    exit_code: int = 0
    failure_log: Path | None = None  # the failing rank's log
    failure_tail: list[str] = field(default_factory=list)  # its last lines
    notes: list[str] = field(default_factory=list)


def validate_shape(nproc: int, lnc: int, phase: Phase = PHASES[DEFAULT_PHASE]) -> list[str]:
    """Usage errors for impossible shapes; notes for shapes the organisers do not accept in ``phase``."""
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: needs at least one process")
    if lnc not in LNC_CHOICES:
        raise UsageError(f"--lnc {lnc}: NEURON_LOGICAL_NC_CONFIG is {choices_text(LNC_CHOICES)}")
    if phase.number == DEFAULT_PHASE:
        # Phase 1 accepts every LNC with each of its nproc choices: the note names nproc only.
        if nproc not in NPROC_CHOICES:
            return [f"--nproc {nproc} is not a valid submission launch (nproc_per_node is {choices_text(NPROC_CHOICES)}); fine for a local run"]
        return []
    if not phase.accepts(lnc, nproc):
        return [f"--nproc {nproc} with --lnc {lnc} is not a valid Phase {phase.number} launch "
                f"(Phase {phase.number} runs {phase.shapes_text()}, the whole {phase.instance}); fine for a local run"]
    return []


def phase_notes(script: Path, nproc: int, lnc: int, phase: Phase) -> list[str]:
    """What a run of ``script`` at this shape should hear about ``phase`` before it starts:
    the launch shape, and an inference.py the phase's submission carries but that is not
    there yet (not refused: a team may write it after training)."""
    notes = validate_shape(nproc, lnc, phase)
    inference = script.parent / INFERENCE_PY
    if phase.inference_py and not inference.is_file():
        notes.append(
            f"Phase {phase.number} submissions carry {INFERENCE_PY} beside train.py and {inference} does not exist yet "
            f"(`trnf package` will refuse without it): `trnf init {script.parent} --inference-only` writes one "
            f"that loads the model with this train.py's load_for_eval"
        )
    return notes


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("kit-%Y%m%d-%H%M%S", time.gmtime())


def _prepare_run_dir(out: Path | None) -> Path:
    run_dir = (out or default_run_dir()).expanduser().resolve()
    if _interrupted_attempt(run_dir):
        # A kit run cannot be resumed (the team's train.py owns its checkpoints): the same
        # command starts it again here, as the interrupt message says.
        shutil.rmtree(run_dir)
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise UsageError(f"run directory {run_dir} already exists; nothing was changed. Choose another with --out DIR")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _interrupted_attempt(run_dir: Path) -> bool:
    """``run_dir`` holds a kit run that was interrupted (its summary says so): a fresh start
    may replace it (trnf created that directory empty for the run)."""
    if not (run_dir / SUMMARY_FILE).is_file():
        return False
    summary = read_summary(run_dir)
    return summary is not None and summary.get("status") == INTERRUPTED


def rerun_command(options: KitOptions, run_dir: Path) -> str:
    """The `trnf train --train-py` line that starts this run again in ``run_dir``."""
    argv = ["train", "--train-py", str(options.train_py), "--nproc", str(options.nproc),
            "--lnc", str(options.lnc), "--out", str(run_dir)]
    if options.phase != DEFAULT_PHASE:
        argv += ["--phase", str(options.phase)]
    if options.timeout is not None:
        argv += ["--timeout", f"{options.timeout:g}"]
    if options.args:
        argv += ["--", *options.args]
    return trnf_line(*argv)


def _checkpoint_facts(path: Path | None) -> dict[str, Any]:
    """params and non-finite tensors from a kit-layout final.pt (read with weights_only=True)."""
    if path is None:
        return {}

    try:
        scanned = scan_final_pt(path)
    except (CheckpointError, OSError) as exc:
        return {"checkpoint_note": str(exc)}
    return {"params": scanned.params, "non_finite": scanned.non_finite}


def _environment_record(plan: launch.LaunchPlan) -> dict[str, str]:
    keys = ("NEURON_LOGICAL_NC_CONFIG", "TRNF_STEP_LOG", KIT_STEP_LOG_ENV, OUT_DIR_ENV, "PYTHONPATH", "PYTHONUNBUFFERED", "TRNF_HOME", "TRNF_DATASET", "TRNF_PREPARE")
    return {k: plan.env[k] for k in keys if k in plan.env}


@dataclass
class _Observed:
    """What a finished launch left behind."""

    outcome: launch.LaunchOutcome
    rank_logs: dict[int, logs.RankLog]
    printed: logs.PrintedRun
    accounting: dict[str, Any] | None
    how: str  # which accounting, or why there is none
    out: out_dir.OutDir  # where the script was told to write
    found: out_dir.Found  # the checkpoint, and whether the script ignored that folder
    facts: dict[str, Any]

    @property
    def checkpoint(self) -> Path | None:
        return self.found.checkpoint


def _start(options: KitOptions) -> tuple[Path, TrustedContract, Path, launch.LaunchPlan, out_dir.OutDir, list[str]]:
    """Preflight, the run directory and the launch plan: (script, contract, run dir, plan, output folder, notes)."""
    script = options.train_py.expanduser().resolve()
    tree = preflight.check_train_py(options.train_py.expanduser())
    notes = phase_notes(script, options.nproc, options.lnc, phase_rules(options.phase))
    if options.args:
        notes.append("arguments after `--` are not part of a valid submission launch: the organisers run train.py without any")
    if not preflight.calls_record_step_boundary(tree):
        notes.append("train.py never mentions record_step_boundary: the budget cannot be accounted")
    contract = load_contract()
    preflight.check_prepare_beside(script, contract.path, contract.sha256)
    run_dir = _prepare_run_dir(options.out)
    shutil.copyfile(script, run_dir / "train.py")
    (run_dir / "contract").mkdir(exist_ok=True)
    shutil.copyfile(contract.path, run_dir / "contract" / "prepare.py")
    exit_settle.add_to_path(run_dir / "site")

    env = child_env(os.environ)
    env[STEP_LOG_ENV] = str(run_dir / STEP_LOG_FILE)
    env[KIT_STEP_LOG_ENV] = str(run_dir / STEP_LOG_FILE)  # the organisers' prepare.py reads this one
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(run_dir / "contract"), str(run_dir / "site"), env.get("PYTHONPATH", "")) if p)
    out = out_dir.choose(env, options.args, run_dir, script.parent)
    env.update(out.env())
    plan = launch.torchrun_plan(
        python=sys.executable, script=script, nproc=options.nproc, lnc=options.lnc, args=options.args,
        cwd=script.parent, env=env, log_dir=run_dir / "logs" / "torchrun",
    )
    (run_dir / LAUNCH_FILE).write_text(plan.organisers + "\n", encoding="utf-8")
    atomic_write_json(run_dir / "launch.json", {
        "organisers": plan.organisers, "argv": plan.argv, "cwd": str(plan.cwd),
        "env": _environment_record(plan), "timeout_seconds": options.timeout,
        "out_dir": str(out.path), "out_dir_chosen_by": out.chosen_by,
    })
    return script, contract, run_dir, plan, out, notes


def _observe(outcome: launch.LaunchOutcome, plan: launch.LaunchPlan, run_dir: Path, contract: TrustedContract, began: float,
             phase: Phase, out: out_dir.OutDir) -> _Observed:
    """Per-rank logs, rank 0's step lines, the budget accounting (``phase``'s), metrics.jsonl, the checkpoint."""
    rank_logs = logs.collect_rank_logs(plan.log_dir, run_dir / "logs")
    rank0 = rank_logs.get(0)
    printed = logs.read_printed([rank0.stdout, rank0.stderr] if rank0 else [])
    step_log = run_dir / STEP_LOG_FILE
    # A log without a header line starts when trnf launched the run (it knows; the log may not say).
    accounting, how = account_log(step_log, contract.module, phase, launch=began)
    charged = summary.charged_by_step(step_log, accounting) if accounting else {}
    summary.write_metrics(run_dir / METRICS_FILE, printed, charged)
    found = out_dir.find(out, plan.cwd, run_dir, since=began - 1.0)
    return _Observed(outcome, rank_logs, printed, accounting, how, out, found, _checkpoint_facts(found.checkpoint))


_ABORTED_AT_EXIT = (
    "rank {rank} aborted while Python shut down, after train.py had finished (torchrun exit {code}): "
    f"'{logs.ABORT_WITHOUT_EXCEPTION}', torch's gloo backend freeing a collective's "
    "tensors too late; the checkpoint and the printed results are complete (log: {log})"
)


# A script that writes beside itself whatever NEURON_COMPETITION_R1_OUT_DIR says: fine alone,
# a collision when two runs of it go at once (`trnf sweep` fails such trials at concurrency > 1).
IGNORES_OUT_DIR = (
    f"train.py ignores {OUT_DIR_ENV} (set to {{out}}) and wrote {{checkpoint}} beside itself: two runs of it at "
    f"once would write, and take, each other's checkpoint (read its --out-dir default from {OUT_DIR_ENV}, as the kit's does)"
)


# A log of step durations only (dt): the time between steps is in no dt, so the charge is
# short of the truth by it, and package/verify refuse such a log as proof of the budget.
LOWER_BOUND_NOTE = (
    "the charge ({charged:.1f} s) is a lower bound: the step log gives each step's duration only ({read}), so the time "
    "between steps is not in it; `trnf package` and `trnf verify` will refuse this log as proof of the budget: have "
    "record_step_boundary write when each step ended (an absolute time, time.time(), or seconds since the start)"
)


def _judge(run: KitRun, seen: _Observed, options: KitOptions) -> tuple[str, int | None]:
    """(status, failing rank), filling the run's problems and failure log."""
    outcome, accounting = seen.outcome, seen.accounting
    status, failed_rank = COMPLETED, None
    if outcome.interrupted:
        status = INTERRUPTED
        run.problems.append("interrupted (Ctrl-C): every process of the run was stopped")
    elif outcome.timed_out:
        status = TIMED_OUT
        run.problems.append(f"train.py still running at --timeout {options.timeout:g} s; the whole process tree was killed")
        run.failure_log = run.run_dir / "logs" / "console.log"
        run.failure_tail = logs.tail(run.failure_log)
    elif outcome.exit_code != 0:
        aborted = logs.rank_aborted_after_finishing(outcome.console, seen.rank_logs)
        if aborted is not None and seen.checkpoint is not None:
            run.notes.append(_ABORTED_AT_EXIT.format(rank=aborted, code=outcome.exit_code, log=seen.rank_logs[aborted].stderr))
        else:
            status = CRASHED
            failed_rank, run.failure_log, run.failure_tail = logs.failure(
                outcome.console, seen.rank_logs, run.run_dir / "logs" / "console.log")
            line = logs.last_error_line(run.failure_tail)
            where = f"on rank {failed_rank}" if failed_rank is not None else "under torchrun"
            # The exception's whole line (cut, if ever, at a word), and where its traceback is.
            run.problems.append(f"train.py crashed {where} (torchrun exit {outcome.exit_code}): "
                                f"{logs.shorten(line)} (traceback: {run.failure_log})")
    nan_step = seen.printed.non_finite_loss_step()
    if nan_step is not None or seen.facts.get("non_finite"):
        status = DIVERGED if status == COMPLETED else status
        what = f"loss is NaN/inf at step {nan_step}" if nan_step is not None else f"NaN/inf weights in {', '.join(seen.facts['non_finite'][:3])}"
        run.problems.append(f"diverged: {what}")
    if accounting is None and status in (COMPLETED, DIVERGED):
        run.problems.append(seen.how)
    if accounting and accounting["over_budget"]:
        run.problems.append(f"over budget: charged {accounting['charged_seconds']:.1f} s of {float(accounting.get('budget_seconds', BUDGET_SECONDS)):g} s")
    if accounting and accounting.get("lower_bound"):
        run.notes.append(LOWER_BOUND_NOTE.format(charged=float(accounting["charged_seconds"]), read=accounting.get("step_log")))
    if seen.checkpoint is None and status == COMPLETED:
        run.problems.append(f"train.py exited 0 but wrote no checkpoint (looked for *.pt under {seen.out.path}, "
                            f"and for {KIT_CHECKPOINT} and *.pt under {options.train_py.parent})")
    if seen.found.ignored:
        run.notes.append(IGNORES_OUT_DIR.format(checkpoint=seen.checkpoint, out=seen.out.path))
    return status, failed_rank


def _document(run: KitRun, seen: _Observed, status: str, failed_rank: int | None, *, script: Path, contract: TrustedContract,
              plan: launch.LaunchPlan, options: KitOptions) -> dict[str, Any]:
    """summary.json: the recipe-run keys (None where a kit run cannot know them) + kit keys."""
    # Imported here: it imports torch, which a refused launch never needs.
    from trnfrontier.runtime.trainer import versions

    accounting, checkpoint, printed = seen.accounting or {}, seen.checkpoint, seen.printed
    fields = summary.printed_fields(printed)
    if seen.facts.get("params") is not None:
        fields["params"] = seen.facts["params"]  # counted in the checkpoint beats a printed number
    document: dict[str, Any] = {
        "name": run.run_dir.name,
        "mode": "kit",
        "status": status,
        "problems": run.problems,
        "notes": run.notes,  # said on the console too; not failures (an abort at exit after finishing)
        "val_bpb": None,  # the trusted score comes from `trnf eval --train-py ... --checkpoint ...`
        **fields,
        "steps": int(accounting["steps"]) if accounting else (printed.last("step") or 0),
        **{key: accounting.get(key) for key in ("charged_seconds", "startup_seconds", "headroom_seconds", "over_budget", "budget_seconds")},
        "accounting": seen.how if accounting else None,
        # How the step log was read and where its start time came from (its header, else trnf's launch).
        "step_log": accounting.get("step_log"),
        "step_log_start": {"time": accounting["start_time"], "source": accounting["start_source"]} if accounting else None,
        "device": None,  # the script chooses its device; trnf does not see it
        "world_size": options.nproc,
        "lnc": options.lnc,
        "phase": options.phase,  # the phase's launch shapes and budget it was held to; `trnf package` follows it
        "versions": versions(),
        "prepare_sha256": contract.sha256,
        "tokenizer_sha256": recorded_tokenizer_sha256(contract),
        "final_checkpoint": str(checkpoint) if checkpoint else None,
        **seen.out.record(seen.found),  # out_dir, out_dir_chosen_by, out_dir_ignored
        "checkpoint_sha256": sha256_file(checkpoint) if checkpoint else None,
        "train_py": str(script),
        "train_py_sha256": sha256_file(script),
        "launch": plan.organisers,
        "exit_code": seen.outcome.exit_code,
        "failed_rank": failed_rank,
        "wall_seconds": seen.outcome.seconds,
        "diverged_step": printed.non_finite_loss_step(),
        "kit_summary": printed.block,  # the `---` block train.py printed (public_val_bpb, num_steps, ...)
        # The organisers' knobs the run was launched with (EVAL_TOKENS sets what its in-process eval scored).
        "kit_env": {k: v for k, v in plan.env.items() if k.startswith(ENV_PREFIX) and k != KIT_STEP_LOG_ENV},
    }
    if accounting and document["budget_seconds"] is None:  # a budget_accounting that omits it
        document["budget_seconds"] = budget_rule.budget_of(contract.module)[0]
    if seen.facts.get("checkpoint_note"):
        document["checkpoint_note"] = seen.facts["checkpoint_note"]
    unprinted = [k for k in ("loss", "lr", "tokens_per_second") if printed.last(k) is None]
    document["missing_fields"] = sorted(
        {k for k in summary.PRINTED_FIELDS if document.get(k) is None} | {f"metrics.{k}" for k in unprinted}
        | {k for k in ("charged_seconds", "final_checkpoint", "device") if document.get(k) is None}
    )
    return document


def _warn(line: str) -> None:
    from trnfrontier.console import err

    err().print(line, style="yellow")


def train_kit(options: KitOptions, *, on_line: Callable[[str], None] | None = None) -> KitRun:
    """Launch, wait (at most ``options.timeout``), then write metrics.jsonl and summary.json.

    Bad input raises TrnfError before anything is launched. A run that fails (crash, NaN,
    over budget, no step log, no checkpoint, timeout) returns with ``problems`` and a
    non-zero ``exit_code``; Ctrl-C stops every process, writes the summary and raises
    KitInterrupted.
    """
    script, contract, run_dir, plan, out, notes = _start(options)
    # Before launch: the compile cache as this run finds it. The script picks its device;
    # with torch-neuronx installed it is the Neuron cache the compiler will use.
    neuron = speed_env.package_version("torch-neuronx") is not None
    speed = speed_env.capture(
        world_size=options.nproc, device=None, lnc=options.lnc, env=plan.env,
        compile_cache=speed_env.compile_cache_url(plan.env) if neuron else None,
    )  # fmt: skip
    from trnfrontier.ledger import record

    # Provenance (git state of the script's repository, environment, sweep trial) before
    # the launch; the run is indexed in the ledger once its summary is written.
    record.start_run(run_dir, script.name, str(script), script, list(options.args), None, _warn)
    began = time.time()
    outcome = launch.run(plan, timeout=options.timeout, console_log=run_dir / "logs" / "console.log", on_line=on_line)
    seen = _observe(outcome, plan, run_dir, contract, began, phase_rules(options.phase), out)
    run = KitRun(run_dir=run_dir, summary={}, notes=notes)
    status, failed_rank = _judge(run, seen, options)
    run.summary = _document(run, seen, status, failed_rank, script=script, contract=contract, plan=plan, options=options)
    run.summary["speed_env"] = speed
    atomic_write_json(run_dir / SUMMARY_FILE, run.summary)
    record.index_run(run_dir, _warn)
    if run.problems:
        # A completed run with problems (over budget, no checkpoint) still fails.
        run.exit_code = exit_code_for(status) or EXIT_FAILED
    if outcome.interrupted:
        raise KitInterrupted(run_dir)
    return run
