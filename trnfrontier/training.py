"""The library behind `trnf train`: plan a run, check it can start, launch it, watch it.

The training itself runs in a child process (``python -m trnfrontier.train_worker``, the
runtime's entry point bound to its parent's life, or torchrun for ``--nproc N > 1``) in its
own process group, so that Ctrl-C or an error here ends every worker and nothing is
orphaned; a ``kill -9`` of trnf takes them too (``lifeline``). One writer per run
directory: trnf takes the run's lock (``runtime.runlock``) and hands it to the trainer. This side validates the recipe, refuses what
would fail or overwrite, writes ``recipe.json``, shows a live view by tailing
``metrics.jsonl`` and reads back ``summary.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.live import Live
from rich.table import Table

from trnfrontier import processes
from trnfrontier.child_env import data_env, diagnostics_env
from trnfrontier.console import err
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.interrupted import clear_stopped_run, restartable
from trnfrontier.lifeline import supervisor_env
from trnfrontier.recipes.loading import load_recipe, validate_recipe
from trnfrontier.recipes.schema import Recipe
from trnfrontier.runtime import host_memory, runlock
from trnfrontier.runtime.atomic import atomic_write_json
from trnfrontier.runtime.checkpoint import check_resumable
from trnfrontier.runtime.checkpoint_ref import latest_checkpoint
from trnfrontier.runtime.devices import NEURON_PIP_HINT
from trnfrontier.runtime.integrity import DamagedFileError
from trnfrontier.runtime.prepare_loader import PREPARE_ENV
from trnfrontier.runtime.rundir import (
    COMPLETED,
    DIVERGED,
    FINAL_EVAL_MARK,
    INTERRUPTED,
    LOG_FILE,
    METRICS_FILE,
    RECIPE_FILE,
    SUMMARY_FILE,
    read_summary,
    write_crash_summary,
)
from trnfrontier.trusted_prepare import load_contract, selected_prepare_path

RUNS_DIR = Path("runs")
# How long the workers get to exit after SIGTERM before SIGKILL.
TERMINATE_GRACE_SECONDS = 10.0
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


# ---------------------------------------------------------------------------- planning


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
    replaces = restartable(run_dir)
    if not replaces and run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        then = (
            f"or continue it with `trnf train --resume {run_dir}`"
            if latest_checkpoint(run_dir) is not None
            else "or remove it (it holds no checkpoint to resume)"
        )
        raise TrnfError(
            f"run directory {run_dir} already exists; nothing was changed. Choose another with --name NAME "
            f"(or --out DIR), {then}",
            exit_code=2,
        )
    plan = _checked_plan(recipe, run_dir, resume=False)
    plan.replaces = replaces
    return plan


def plan_resume(run_dir: Path, overrides: list[str], nproc: int | None = None) -> RunPlan:
    """Continue a run from its latest checkpoint with its own recipe.json."""
    run_dir = run_dir.expanduser()
    if overrides:
        raise UsageError(
            f"--resume continues with {run_dir / RECIPE_FILE} as it is; overrides are not allowed ({overrides[0]})"
        )
    if not run_dir.is_dir():
        raise TrnfError(f"--resume {run_dir}: no such directory", exit_code=2)
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
            raise TrnfError(f"no prepared dataset to train on: {exc}") from None
    check_token_files(module, recipe.data.dataset)
    device = recipe.runtime.device
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
        "trnfrontier.train_worker",
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


# ---------------------------------------------------------------------------- running


class MetricsTail:
    """New complete lines of metrics.jsonl since the last call (a half-written line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        if len(chunk) == 0:
            return []
        self.offset += len(chunk)
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = lines.pop()
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records


class PhaseWatch:
    """The worker's announced phase (the final evaluation) from new lines of train.log:
    minutes in which metrics.jsonl gets nothing new, so the live view says what is going on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.phase: str | None = None
        self.since: float | None = None

    def read(self) -> str | None:
        """The phase line when one appeared since the last call, else None."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return None
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        found = None
        for line in complete.decode("utf-8", "replace").splitlines():
            if line.startswith(FINAL_EVAL_MARK):
                found = line.strip()
        if found is not None:
            self.phase, self.since = found, time.time()
        return found


def live_view(
    last: dict[str, Any] | None,
    budget: float,
    run_dir: Path,
    started: float,
    best_val: float | None,
    phase: PhaseWatch | None = None,
) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("run", str(run_dir))
    if phase is not None and phase.phase is not None:
        table.add_row("status", f"{phase.phase} ({time.time() - (phase.since or started):.0f} s)")
    if not last:
        table.add_row(
            "status",
            f"starting ({time.time() - started:.0f} s): imports, data, first step compiles",
        )
        return table
    charged = last.get("charged_seconds") or 0.0
    table.add_row(
        "step", f"{last['step']:,}" + ("  (startup, not charged)" if last.get("startup") else "")
    )
    loss = last.get("loss")
    table.add_row("loss", "nan" if loss is None else f"{loss:.4f}")
    table.add_row("lr", f"{last.get('lr', 0.0):.3g}")
    tps = last.get("tokens_per_second")
    mfu = last.get("mfu")
    table.add_row(
        "tok/s", ("-" if not tps else f"{tps:,.0f}") + (f"   mfu {100 * mfu:.1f}%" if mfu else "")
    )
    table.add_row("charged", f"{charged:,.1f} / {budget:,.0f} s")
    table.add_row("headroom", f"{budget - charged:,.1f} s")
    if best_val is not None:
        table.add_row("val_bpb", f"{best_val:.4f}")
    return table


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """End the child and everything it started (torchrun runs each worker in its own
    session, so its process group alone does not reach them): TERM, then KILL."""
    if proc.poll() is not None:
        return
    processes.stop_tree(proc, grace=TERMINATE_GRACE_SECONDS)


def run_plan(
    plan: RunPlan,
    *,
    live: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    poll_seconds: float = 0.5,
) -> dict[str, Any]:
    """Take the run directory's lock, write recipe.json (new runs), start the child,
    follow it, return its summary."""
    try:
        lock = runlock.acquire(plan.run_dir, command=" ".join(["trnf", *sys.argv[1:]])[:300])
    except runlock.RunLockedError as exc:
        raise TrnfError(str(exc)) from None
    if lock.took_over:
        err().print(f"[yellow]{lock.took_over}[/yellow]")
    try:
        return _run_locked(plan, {runlock.TOKEN_ENV: lock.token}, live, on_record, poll_seconds)
    finally:
        lock.release()


class _Follower:
    """What `trnf train` shows while its worker runs: a live view on a terminal, else a
    plain line now and then (CI, a pipe); every new metrics record goes to ``on_record``."""

    def __init__(
        self, run_dir: Path, budget: float, live: bool, on_record: Callable[[dict[str, Any]], None] | None
    ) -> None:
        # Made before the worker starts: the tails read only what this run appends.
        self.run_dir, self.budget, self.live, self.on_record = run_dir, budget, live, on_record
        self.tail = MetricsTail(run_dir / METRICS_FILE)
        self.watch = PhaseWatch(run_dir / LOG_FILE)
        self.started = time.time()
        self.console = err()
        self.last: dict[str, Any] | None = None
        self.best_val: float | None = None
        self.last_note, self.noted_step = time.time(), None
        self.display: Live | None = None

    def start(self) -> None:
        if self.live and self.console.is_terminal:
            self.display = Live(
                live_view(None, self.budget, self.run_dir, self.started, None),
                console=self.console,
                refresh_per_second=4,
                transient=False,
            )
            self.display.start()
        self.last_note = time.time()

    def stop(self) -> None:
        if self.display is not None:
            self.display.stop()

    def update(self, finished: bool) -> None:
        for record in self.tail.read():
            self.last = record
            if record.get("val_bpb") is not None:
                best = self.best_val
                self.best_val = record["val_bpb"] if best is None else min(best, record["val_bpb"])
            if self.on_record is not None:
                self.on_record(record)
        announced = self.watch.read()
        last = self.last
        if self.display is not None:
            self.display.update(live_view(last, self.budget, self.run_dir, self.started, self.best_val, self.watch))
            return
        if not self.live:
            return
        # The last step before a phase announcement first, so the lines read in order.
        if (
            last is not None
            and last["step"] != self.noted_step
            and (finished or announced is not None or time.time() - self.last_note >= 30)
        ):
            loss = last.get("loss")
            self.console.print(
                f"step {last['step']}  loss {'nan' if loss is None else f'{loss:.4f}'}  "
                f"charged {last.get('charged_seconds') or 0:.0f}/{self.budget:g} s"
            )
            self.last_note, self.noted_step = time.time(), last["step"]
        if announced is not None:
            self.console.print(announced)


def _run_locked(
    plan: RunPlan,
    lock_env: dict[str, str],
    live: bool,
    on_record: Callable[[dict[str, Any]], None] | None,
    poll_seconds: float,
) -> dict[str, Any]:
    run_dir = plan.run_dir
    if plan.replaces:
        clear_stopped_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not plan.resume:
        atomic_write_json(run_dir / RECIPE_FILE, plan.recipe.model_dump(mode="json"))
    previous_summary = (
        (run_dir / SUMMARY_FILE).stat().st_mtime_ns if (run_dir / SUMMARY_FILE).exists() else None
    )
    env = {**os.environ, **plan.env, **lock_env}
    follow = _Follower(run_dir, plan.recipe.budget.seconds, live, on_record)
    with open(run_dir / LOG_FILE, "ab") as log:
        log.write(f"$ {' '.join(plan.command)}\n".encode())
        log.flush()
        proc = processes.start(
            plan.command, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=None, die_with_parent=True
        )
        with processes.sigterm_as_interrupt():
            try:
                follow.start()
                while True:
                    finished = proc.poll() is not None
                    follow.update(finished)
                    if finished:
                        break
                    time.sleep(poll_seconds)
            except BaseException as exc:
                _terminate(proc)
                if isinstance(exc, KeyboardInterrupt) and not _fresh_summary(run_dir, previous_summary):
                    # The worker stops without a summary on Ctrl-C; the run directory says
                    # what happened, and that it may be restarted when it has no checkpoint.
                    write_crash_summary(
                        run_dir,
                        name=plan.recipe.name,
                        error="interrupted (Ctrl-C or SIGTERM)",
                        last_good_checkpoint=latest_checkpoint(run_dir),
                        status=INTERRUPTED,
                    )
                raise
            finally:
                follow.stop()
    return _worker_summary(plan, proc.returncode, previous_summary)


def _worker_summary(plan: RunPlan, returncode: int, previous_summary: int | None) -> dict[str, Any]:
    """The summary the worker wrote, or a crash summary when it wrote none (a kill, a crash
    before the trainer could write one); with the run dir and the worker's exit code."""
    run_dir = plan.run_dir
    summary = read_summary(run_dir)
    if not _fresh_summary(run_dir, previous_summary) or summary is None:
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
        summary = write_crash_summary(
            run_dir,
            name=plan.recipe.name,
            error=f"the training process ended without a summary ({how}); see {run_dir / LOG_FILE}",
            last_good_checkpoint=latest_checkpoint(run_dir),
        )
    summary.setdefault("run_dir", str(run_dir))
    summary["exit_code"] = returncode
    return summary


def _fresh_summary(run_dir: Path, previous_mtime_ns: int | None) -> bool:
    """True when the worker wrote summary.json since the run started."""
    try:
        return (run_dir / SUMMARY_FILE).stat().st_mtime_ns != previous_mtime_ns
    except OSError:
        return False


def failure_message(summary: dict[str, Any], run_dir: Path) -> str | None:
    """One line for a run that did not complete (None when it did)."""
    status = summary.get("status")
    if status == COMPLETED:
        return None
    if status == DIVERGED:
        where = summary.get("last_good_checkpoint") or "none"
        return (
            f"training diverged at step {summary.get('diverged_step')} (loss NaN/inf or above run.max_loss); "
            f"last good checkpoint: {where}. Lower the LRs, or resume with `trnf train --resume {run_dir}`"
        )
    detail = summary.get("error") or "unknown error"
    hint = (
        f"; resume with `trnf train --resume {run_dir}`"
        if summary.get("last_good_checkpoint")
        else ""
    )
    return f"training {status}: {detail} (log: {run_dir / LOG_FILE}){hint}"


def tail_log(run_dir: Path, lines: int = 15) -> str:
    try:
        text = (run_dir / LOG_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


