"""`trnf train --train-py train.py --dry-run`: the team's file on CPU, before chip time.

The same file, under torchrun with the chosen world size, gloo on CPU, for a few steps
(``TRNF_DRY_RUN_STEPS``, the variable `trnf verify --dry-run` sets; kit-style scripts
honour it), in the clean environment of the kit harness (``harness``: a venv holding
only the organisers' packages and the trusted prepare.py, ``python -I``, a scrubbed
environment). It runs on a copy of the script's code in a work directory, so a dry run
never overwrites the team's real ``out/final.pt``.

Stages, each pass/fail: source (exists, parses, defines load_for_eval, no foreign
prepare.py beside it), environment, start (every rank launched, a first step boundary),
steps (every rank exited 0, the step log advanced), checkpoint (written), load_for_eval
(loads it back and gives finite logits, in the clean environment).
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from trnfrontier.contract.budget import no_step_log, unread_step_log
from trnfrontier.contract.checkpoint import find_checkpoint
from trnfrontier.contract.kit import NUM_STEPS_ENV
from trnfrontier.contract.steplog import Boundary, StepLogError, read_step_log
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.kit import launch, logs, preflight
from trnfrontier.kit.harness import (
    DRY_RUN_STEPS_ENV,
    build_clean_env,
    clean_environ,
    confine,
    load_back,
)
from trnfrontier.progress import Steps
from trnfrontier.runtime.rundir import STEP_LOG_FILE
from trnfrontier.trusted_prepare import load_contract

STAGES = ("source", "environment", "start", "steps", "checkpoint", "load_for_eval")
# Directories never copied into the dry run: caches, environments, outputs.
_SKIP_DIRS = {"__pycache__", "out", "runs", "node_modules", "site-packages"}
_COPY_DEPTH = 3


@dataclass
class Stage:
    name: str
    passed: bool | None  # None: not reached
    detail: str


# What each stage is doing, for the progress display while it runs.
STAGE_DOING = {
    "source": "checking train.py",
    "environment": "building the clean environment (a venv with the organisers' packages)",
    "start": "launching train.py under torchrun (gloo, CPU)",
    "steps": "waiting for the steps",
    "checkpoint": "looking for the checkpoint",
    "load_for_eval": "loading the checkpoint back through load_for_eval",
}


@dataclass
class DryRunReport:
    stages: list[Stage] = field(default_factory=list)
    failure_log: Path | None = None
    failure_tail: list[str] = field(default_factory=list)
    progress: Steps = field(default_factory=Steps.none)

    @property
    def passed(self) -> bool:
        return all(stage.passed for stage in self.stages)

    def first_failure(self) -> Stage | None:
        return next((s for s in self.stages if s.passed is False), None)

    def add(self, name: str, passed: bool, detail: str) -> bool:
        self.stages.append(Stage(name, passed, detail))
        self.progress.advance()
        following = STAGES[STAGES.index(name) + 1:] if name in STAGES else ()
        if passed and following:
            self.progress.describe(f"dry run: {STAGE_DOING[following[0]]}")
        return passed

    def skip_rest(self) -> DryRunReport:
        done = {s.name for s in self.stages}
        self.stages.extend(Stage(n, None, "not reached") for n in STAGES if n not in done)
        return self


def copy_code(source: Path, dest: Path) -> list[str]:
    """The script's directory's .py files (to depth 3; no prepare.py, hidden, cache, venv
    or output folders) into ``dest``: train.py and the kernel files it imports."""
    copied: list[str] = []
    for path in sorted(source.rglob("*.py")):
        rel = path.relative_to(source)
        parts = rel.parts
        if len(parts) > _COPY_DEPTH or rel == Path("prepare.py"):
            continue
        if any(p.startswith(".") or p in _SKIP_DIRS for p in parts[:-1]):
            continue
        if any((source.joinpath(*parts[:i]) / "pyvenv.cfg").exists() for i in range(1, len(parts))):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        copied.append(rel.as_posix())
    return copied


def _boundaries(step_log: Path, launched: float) -> tuple[tuple[Boundary, ...], str]:
    """(the boundaries the run's last process recorded, why there are none): a log without a
    header line starts at the launch; one trnf cannot read is said to be that, not blamed
    on train.py (which did call record_step_boundary)."""
    if not step_log.is_file():
        return (), no_step_log(step_log)
    try:
        boundaries = read_step_log(step_log, launch=launched, launch_source="the dry run's launch").last.boundaries
    except (OSError, StepLogError) as exc:
        return (), unread_step_log(step_log, exc)
    return boundaries, "" if boundaries else f"the step log {step_log} records no step"


def _rank_steps(rank_logs: dict[int, logs.RankLog]) -> str:
    counts = []
    for rank in sorted(rank_logs):
        printed = logs.read_printed([rank_logs[rank].stdout, rank_logs[rank].stderr])
        counts.append(f"rank {rank}: {len(printed.records)}")
    return ", ".join(counts)


def dry_run_kit(train_py: Path, work: Path, *, nproc: int, lnc: int, steps: int, timeout: float,
                args: tuple[str, ...] = (), progress: Steps | None = None) -> DryRunReport:
    """Run the dry run in ``work`` (an empty directory the caller owns and may keep);
    ``progress`` advances once per stage (``len(STAGES)`` in all)."""
    report = DryRunReport(progress=progress or Steps.none())
    report.progress.describe(f"dry run: {STAGE_DOING['source']}")
    script = train_py.expanduser().resolve()
    contract = load_contract()
    try:
        preflight.check_train_py(train_py.expanduser())
        preflight.check_prepare_beside(script, contract.path, contract.sha256)
    except UsageError:
        raise
    except TrnfError as exc:
        report.add("source", False, str(exc))
        return report.skip_rest()
    run_dir = work / "run"
    run_dir.mkdir(parents=True)
    copied = copy_code(script.parent, run_dir)
    if script.name != "train.py":  # the load probe, like the organisers, looks for train.py
        shutil.copyfile(script, run_dir / "train.py")
    report.add("source", True, f"parses, defines load_for_eval; {len(copied)} .py file(s) copied")

    try:
        python = build_clean_env(work, contract.path)
    except Exception as exc:  # noqa: BLE001 - venv/symlink/metadata failures all mean the same here
        report.add("environment", False, f"could not build the clean environment: {exc}")
        return report.skip_rest()
    report.add("environment", True, "venv with only the organisers' packages + the trusted prepare.py (python -I)")

    home = work / "home"
    home.mkdir()
    env = clean_environ(home, nproc, lnc, steps, run_dir)
    plan = launch.torchrun_plan(python=str(python), script=run_dir / script.name, nproc=nproc, lnc=lnc, args=args,
                                cwd=run_dir, env=env, log_dir=work / "logs" / "torchrun", isolated=True)
    # The team's code runs inside the same sandbox as verify's dry run (work dir writable only).
    confined, outer_env, how = confine(plan.argv, work=work, run_dir=run_dir, env=plan.env, prepare=contract.path, timeout=timeout)
    plan = dataclasses.replace(plan, argv=confined, env=outer_env)
    launched = time.time()
    outcome = launch.run(plan, timeout=timeout, console_log=work / "logs" / "console.log")
    rank_logs = logs.collect_rank_logs(plan.log_dir, work / "logs")
    boundaries, unrecorded = _boundaries(run_dir / STEP_LOG_FILE, launched)

    missing = [r for r in range(nproc) if r not in rank_logs]
    why, exited = "", "exited 0"
    crashed = outcome.exit_code not in (0, None)
    aborted = logs.rank_aborted_after_finishing(outcome.console, rank_logs) if crashed else None
    if aborted is not None:
        # Not a failure of train.py: the checkpoint and load_for_eval checks below still judge the run.
        crashed, exited = False, f"finished (rank {aborted} then aborted in Python's shutdown: {logs.ABORT_WITHOUT_EXCEPTION})"
    elif crashed:
        rank, report.failure_log, report.failure_tail = logs.failure(outcome.console, rank_logs, work / "logs" / "console.log")
        why = f"rank {rank} failed (torchrun exit {outcome.exit_code}): {logs.shorten(logs.last_error_line(report.failure_tail))}"
    elif outcome.timed_out:
        report.failure_log = work / "logs" / "console.log"
        report.failure_tail = logs.tail(report.failure_log)
        why = (f"still running after {timeout:g} s (process tree killed): does train.py stop after "
               f"{DRY_RUN_STEPS_ENV}={steps} (the kit: {NUM_STEPS_ENV}) steps?")
    if missing or not boundaries:
        detail = (f"rank(s) {', '.join(map(str, missing))} never started" if missing
                  else why if (crashed or outcome.timed_out) else unrecorded)
        report.add("start", False, detail)
        return report.skip_rest()
    report.add("start", True, f"{nproc} rank(s) launched (gloo, CPU, {how}), first boundary at step index {boundaries[0][0]}")
    if crashed or outcome.timed_out:
        report.add("steps", False, why)
        return report.skip_rest()
    # record_step_boundary takes the 0-based index: the last index + 1 steps completed.
    report.add("steps", True, f"all {nproc} rank(s) {exited}; step log recorded {boundaries[-1][0] + 1} steps "
                               f"({DRY_RUN_STEPS_ENV} = {NUM_STEPS_ENV} = {steps}); step lines printed: {_rank_steps(rank_logs)}")

    checkpoint = find_checkpoint(run_dir)
    if checkpoint is None:
        report.add("checkpoint", False, "train.py finished but wrote no checkpoint (out/final.pt or any *.pt)")
        return report.skip_rest()
    report.add("checkpoint", True, f"{checkpoint.relative_to(run_dir)} ({checkpoint.stat().st_size:,} bytes)")

    loaded, detail = load_back(run_dir, checkpoint, python=python, env=env, timeout=timeout)
    if not loaded:
        report.add("load_for_eval", False, f"{checkpoint.relative_to(run_dir)} does not load back: {detail}")
        return report.skip_rest()
    report.add("load_for_eval", True, f"load_for_eval({checkpoint.relative_to(run_dir)}, 'cpu'): {detail}, finite logits")
    return report
