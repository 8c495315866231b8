"""The budgeted training loop: ``train(recipe, out_dir, resume=False) -> summary``.

``recipe`` is the resolved recipe (``Recipe.model_dump(mode="json")``), typed on entry as
``recipe.ResolvedRecipe`` (a missing or unknown key stops the run before anything starts).
One call trains one run directory (layout in docs/architecture.md): it seeds everything,
builds the model and optimizers, accumulates gradients up to ``data.total_batch_tokens``,
drives the LR by the charged fraction of the budget (or by steps), stops when the
organisers' clock says one more step would not fit, writes ``metrics.jsonl``, periodic
resumable checkpoints, the consolidated ``final/`` checkpoint and ``summary.json`` with
the trusted ``evaluate_bpb`` of that final checkpoint.

Under torchrun every rank runs this; rank 0 alone writes files. Every decision that
leads to a collective (stop, diverged, evaluate, checkpoint) is OR-ed over ranks first.
"""

from __future__ import annotations

import inspect
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn

from trnfrontier.runtime import (
    assembly,
    devices,
    distributed,
    host_memory,
    interrupt,
    muon,
    prepare_calls,
    runlock,
    speed_env,
)
from trnfrontier.runtime import checkpoint as ckpt
from trnfrontier.runtime.atomic import DiskFullError, atomic_write_json
from trnfrontier.runtime.checkpoint_ref import latest_checkpoint
from trnfrontier.runtime.clock import BudgetClock, process_start_time
from trnfrontier.runtime.faults import fault_line
from trnfrontier.runtime.metrics import MetricsWriter, truncate_after
from trnfrontier.runtime.prepare_loader import load_prepare, sha256_file
from trnfrontier.runtime.recipe import EvalSpec, RecipeError, ResolvedRecipe
from trnfrontier.runtime.rundir import (
    COMPILE_MARK,
    COMPLETED,
    DIVERGED,
    FINAL_EVAL_MARK,
    FIRST_STEP_MARK,
    INTERRUPTED,
    METRICS_FILE,
    STEP_LOG_ENV,
    STEP_LOG_FILE,
    SUMMARY_FILE,
    RunStatus,
    write_crash_summary,
)
from trnfrontier.runtime.schedule import progress_from_steps
from trnfrontier.runtime.step import StepResult

KEEP_CHECKPOINTS = 2


class TrainingError(RuntimeError):
    """A run that cannot start (bad recipe for this environment, nothing to resume)."""


def versions() -> dict[str, str | None]:
    trnf: str | None
    try:
        from importlib.metadata import version

        trnf = version("trnfrontier")
    except Exception:  # noqa: BLE001 - a vendored runtime has no distribution metadata
        trnf = getattr(sys.modules.get("trnfrontier"), "__version__", None)
    return {"python": platform.python_version(), "torch": torch.__version__, "trnf": trnf}


@dataclass
class _Loop:
    """What the loop's pieces (train_step, periodic, finish) share during one run."""

    clock: BudgetClock
    loaders: list[Any]
    started: float
    last_ckpt: float
    last_eval: float
    lrm: float = 1.0  # the LR multiplier of the latest step
    step_end: float = 0.0  # when the latest step's boundary was recorded
    steady_from: tuple[int, float] | None = None  # (tokens, time) when startup ended
    status: RunStatus = COMPLETED
    stop_reason: str = ""
    diverged_step: int | None = None
    last_good: Path | None = None
    last_loss: float = float("nan")


class Trainer:
    """One run, in four parts: setup (``__init__``: tokenizer, then ``assembly``'s model,
    optimizers and step, with a resume loaded in between), ``train_step`` (one optimizer step, ``step.TrainStep``),
    ``periodic`` (logging, evaluation, checkpoints, the stop decision) and ``finish``
    (final checkpoint, trusted evaluation, summary.json). ``run`` strings them together."""

    def __init__(
        self,
        recipe: ResolvedRecipe,
        out_dir: Path,
        resume: bool,
        prepare: ModuleType,
        info: distributed.DistInfo,
        spec: devices.DeviceSpec,
        *,
        time_fn: Callable[[], float] | None = None,
    ) -> None:
        """``time_fn``: the clock every budget decision reads. None (a real run): wall time,
        with the budget charged from when prepare.py was imported (the organisers' rule).
        Given (tests, a caller that runs many trainings in one process): the budget starts
        when the trainer does, so nothing depends on how long the process has lived."""
        self.recipe, self.out_dir, self.resume = recipe, out_dir, resume
        self.time_fn = time_fn or time.time
        self.start_time: float | None = None if time_fn is None else time_fn()
        self.prepare, self.info, self.spec = prepare, info, spec
        self.device = spec.device
        self.main = info.is_main
        r = recipe
        self.tokenizer = prepare.ensure_tokenizer()
        vocab = self.tokenizer.get_vocab_size()
        if vocab != r.model.vocab_size:
            raise TrainingError(
                f"model.vocab_size={r.model.vocab_size} but the tokenizer has {vocab} tokens"
            )
        try:
            parts = assembly.build_parts(r, spec, info)
        except RecipeError as exc:
            raise TrainingError(str(exc)) from None
        self.parts, self.geometry, self.kernels = parts, parts.geometry, parts.kernels
        self.model, self.optimizers, self.matrix_lr = parts.model, parts.optimizers, parts.matrix_lr
        self.params = self.model.num_params()
        self.flops_per_token = self.model.flops_per_token(self.geometry.seq_len)
        self.prepare_sha256 = sha256_file(str(prepare.__file__))
        self.tokenizer_sha256 = getattr(self.tokenizer, "sha256", None)

        self.step, self.tokens = 0, 0
        self.saved_step = 0  # the step of the newest checkpoint this run can resume from
        self.stop_request = interrupt.StopRequest()  # set by Ctrl-C while run() steps
        self.prior_charged, self.prior_excluded = 0.0, 0.0
        self.data_state: list[dict[str, Any]] | None = None  # one state per data stream
        self.resumed_from: str | None = None
        if resume:
            self._restore()

        built = assembly.build_step(parts)
        self.stepper, self.compiled, self.sharded = built.stepper, built.compiled, built.sharded
        # CPU: started so that the step's large tensors reuse heap blocks (host_memory).
        self.host_memory_kept = self.device.type == "cpu" and host_memory.kept()
        # What changes speed besides the recipe, read before anything compiles (torch.compile
        # compiles at the first step; a cold cache is part of the record): summary.json's speed_env.
        self.speed_env = speed_env.capture(
            world_size=info.world_size,
            device=self.device.type,
            lnc=r.runtime.lnc if self.device.type == "neuron" else None,
            compile_cache=os.environ.get("TORCHINDUCTOR_CACHE_DIR") if self.compiled else None,
        )
        self.first_step_seconds: float | None = None
        self.metrics = MetricsWriter(out_dir / METRICS_FILE, enabled=self.main)

    # -------------------------------------------------------------- resume

    def _restore(self) -> None:
        latest = latest_checkpoint(self.out_dir)
        if latest is None:
            raise TrainingError(
                f"{self.out_dir} has no complete checkpoint under checkpoints/ to resume from"
            )
        restored = ckpt.load_checkpoint(
            latest, self.model, self.optimizers, self.device, self.info.rank
        )
        meta, state = restored["meta"], restored["state"]
        if int(meta.get("world_size", 1)) != self.info.world_size:
            raise TrainingError(
                f"{latest} was written by {meta.get('world_size')} processes; resume with the same --nproc"
            )
        self.step, self.tokens = int(meta["step"]), int(meta["tokens"])
        self.saved_step = self.step
        self.prior_charged = float(meta["charged_seconds"])
        self.prior_excluded = float(meta.get("excluded_seconds", 0.0))
        self.data_state = state["data"]
        ckpt.restore_rng(state["rng"], restored["rng"], self.device)
        if self.main:
            truncate_after(self.out_dir / METRICS_FILE, self.step)
        self.resumed_from = str(latest)

    # -------------------------------------------------------------- pieces

    def _meta(self, clock: BudgetClock) -> dict[str, Any]:
        accounting = clock.summary()
        return {
            "step": self.step,
            "tokens": self.tokens,
            "charged_seconds": clock.charged_seconds(),
            "excluded_seconds": accounting["excluded_seconds"],
            "recipe": self.recipe.to_dict(),
            "params": self.params,
            "world_size": self.info.world_size,
            "device": self.spec.name,
            "prepare_sha256": self.prepare_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
        }

    def _save_checkpoint(self, clock: BudgetClock) -> Path | None:
        """Every rank contributes its data-loader and RNG state; rank 0 writes."""
        plain, tensors = ckpt.capture_rng(self.device)
        states = distributed.gather_objects({"data": self.data_state, "rng": plain})
        rngs = distributed.gather_objects({k: v.cpu() for k, v in tensors.items()})
        # Sharded: every rank's share of the optimizer state, gathered to rank 0.
        optim_states = self.sharded.state_dicts() if self.sharded is not None else None
        path = None
        if self.main:
            try:
                path = ckpt.save_checkpoint(
                    self.out_dir,
                    step=self.step,
                    model=self.model,
                    optimizers=self.optimizers,
                    optim_states=optim_states,
                    meta=self._meta(clock),
                    rank_states=states,  # type: ignore[arg-type]  # gathered copies of the dicts above
                    rank_rng=rngs,  # type: ignore[arg-type]
                    keep_last=KEEP_CHECKPOINTS,
                )
            except DiskFullError as exc:
                # A full disk costs this checkpoint, not the run: the previous one stays.
                _warn(f"warning: {exc}; checkpoint skipped, last good one: {latest_checkpoint(self.out_dir)}")
        (saved,) = distributed.any_true([path is not None], self.device)
        if saved:
            self.saved_step = self.step  # what a Ctrl-C would lose is counted from here
        return path

    def _save_final(self, clock: BudgetClock) -> Path:
        """final/; on a full disk, once more after removing all but the newest resumable
        checkpoint (that one stays: from it `--resume` can always redo the run's end)."""
        try:
            return ckpt.save_final(self.out_dir, self.model, self._meta(clock))
        except DiskFullError as exc:
            dropped = ckpt.drop_older_checkpoints(self.out_dir, keep_last=1)
            if not dropped:
                raise
            names = ", ".join(p.name for p in dropped)
            _warn(f"warning: {exc}; removed the older checkpoint {names} to make room, retrying")
            return ckpt.save_final(self.out_dir, self.model, self._meta(clock))

    def _evaluate(self) -> dict[str, Any]:
        """Periodic validation through the trusted evaluate_bpb (every rank takes a share).

        The split is evaluate_bpb's default (the public validation split): the runtime
        names no validation data itself, as the organisers' static screen requires."""
        with devices.autocast(self.device, self.spec.dtype):
            return recipe_evaluate_bpb(
                self.prepare, self.model, self.tokenizer, self.device, self.recipe.eval
            )

    def _make_loaders(self) -> list[Any]:
        """The training data streams of this process.

        When the loader takes ``rank``/``world_size`` (this project's prepare.py does), the
        global batch is cut into world_size x accum virtual shards and micro-step m of rank
        r reads shard r + world_size * m. A step then sees the same rows whether it runs as
        one process accumulating, or as several ranks: results compare across --nproc.
        A prepare.py without those parameters gets one stream per process (rank-sharded by
        the loader itself), read for consecutive micro-batches.
        """
        make = self.prepare.make_dataloader
        params: Mapping[str, inspect.Parameter]
        try:
            params = inspect.signature(make).parameters
        except (TypeError, ValueError):
            params = {}
        saved = self.data_state
        shardings: list[dict[str, int]] = [{}]
        if "rank" in params and "world_size" in params:
            world = self.info.world_size
            if saved is not None and len(saved) != self.geometry.accum:
                raise TrainingError(
                    f"the checkpoint has {len(saved)} data streams for {self.geometry.accum} micro-steps; resume with the same recipe"
                )
            shardings = [
                {"rank": self.info.rank + world * m, "world_size": world * self.geometry.accum}
                for m in range(self.geometry.accum)
            ]
        # Positional as the kit calls it; resume_state / rank / world_size only when this
        # prepare.py's signature takes them (the organisers' takes none of them).
        return [
            prepare_calls.make_dataloader(
                self.prepare,
                self.tokenizer,
                self.geometry.batch_size,
                self.geometry.seq_len,
                "train",
                self.device,
                resume_state=saved[i] if saved else None,
                **sharding,
            )
            for i, sharding in enumerate(shardings)
        ]

    def _weights_finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.model.parameters())

    def _progress(self, clock: BudgetClock) -> float:
        s = self.recipe.schedule
        if s.mode == "steps" and s.total_steps is not None:
            return progress_from_steps(self.step, s.total_steps)
        return clock.progress()

    def _step_limit_reached(self) -> str:
        """The step-count limits (the same on every rank: no collective needed)."""
        b, s = self.recipe.budget, self.recipe.schedule
        if b.max_steps and self.step >= b.max_steps:
            return "max_steps"
        if s.mode == "steps" and s.total_steps is not None and self.step >= s.total_steps:
            return "total_steps"
        return ""

    def _stop_reason(self, clock: BudgetClock) -> str:
        """Why this rank would stop after the current step ("" to go on)."""
        return self._step_limit_reached() or ("budget" if clock.should_stop() else "")

    def _mfu(self, tokens_per_second: float | None) -> float | None:
        """Model FLOPs utilisation of all ranks together (None when the peak is unknown)."""
        if not (self.spec.peak_flops and tokens_per_second):
            return None
        peak = self.spec.peak_flops * self.info.world_size
        return tokens_per_second * self.flops_per_token / peak

    # -------------------------------------------------------------- the loop

    def run(self) -> dict[str, Any]:
        """Set up, step until a limit, the budget, divergence or Ctrl-C stops the run, finish."""
        with interrupt.stop_requests(lambda: self.step - self.saved_step) as self.stop_request:
            loop = self.begin()
            self.model.train()
            while True:
                result = self.train_step(loop)
                if result is None or self.periodic(loop, result):
                    break
        return self.finish(loop)

    def begin(self) -> _Loop:
        """The loop's state: the budget clock (from the process start), the data streams."""
        b = self.recipe.budget
        clock = BudgetClock(
            b.seconds,
            b.startup_steps_excluded,
            b.startup_allowance_cap_seconds,
            b.checkpoint_reserve_seconds,
            time_fn=self.time_fn,
            # The clock counts completed steps from 1; prepare.py takes the 0-based index
            # of the step just completed (the kit's call: record_step_boundary(step)).
            on_boundary=lambda completed: prepare_calls.record_step_boundary(self.prepare, completed - 1),
            start_time=self.start_time
            or getattr(self.prepare, "PROCESS_START_TIME", None)
            or process_start_time(),
            prior_charged_seconds=self.prior_charged,
            prior_excluded_seconds=self.prior_excluded,
        )
        loaders = self._make_loaders()
        self.stepper.streams = len(loaders)
        last = self.time_fn()
        return _Loop(clock, loaders, started=self.time_fn(), last_ckpt=last, last_eval=last)

    def train_step(self, loop: _Loop) -> StepResult | None:
        """One optimizer step and its bookkeeping; None when the run stops instead (a step
        limit already reached, or a diverged loss whose update was not applied)."""
        # A resumed run may already be at its step limit: then it takes no further step.
        limit = self._step_limit_reached()
        if limit:
            loop.stop_reason = limit
            return None
        clock, loaders = loop.clock, loop.loaders
        max_loss = float(self.recipe.run.max_loss)
        if self.first_step_seconds is None and self.main and self.compiled:
            # Minutes without a step on a cold cache: say what they are spent on.
            cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "torch's default")
            print(f"{COMPILE_MARK} the first step compiles the training step (torch.compile; cache {cache})", flush=True)
        clock.step_started()
        loop.lrm = self.parts.schedule(self.step, self._progress(clock))

        def accept(loss: float) -> bool:
            (bad,) = distributed.any_true([not math.isfinite(loss) or loss > max_loss], self.device)
            return not bad

        result = self.stepper.take(lambda micro: next(loaders[micro % len(loaders)]), accept=accept)
        if not result.applied:
            self._diverged(loop, result.loss, max_loss)
            return None
        devices.synchronize(self.device)
        self.step += 1
        self.tokens += self.geometry.tokens
        self.data_state = result.data_state
        clock.boundary(self.step)
        loop.step_end = self.time_fn()
        if self.first_step_seconds is None:
            self._report_first_step(clock.last_step_seconds)
        if loop.steady_from is None and not clock.in_startup:
            loop.steady_from = (self.tokens, loop.step_end)
        return result

    def _report_first_step(self, seconds: float) -> None:
        """The first step of a process carries the compile cost: say it once."""
        self.first_step_seconds = seconds
        if self.main and self.compiled:
            print(f"{FIRST_STEP_MARK}{seconds:.1f} s (includes torch.compile)", flush=True)

    def _diverged(self, loop: _Loop, loss: float, max_loss: float) -> None:
        # The update from this loss was never applied: the weights are still those that
        # every earlier (finite) step produced.
        loop.status, loop.stop_reason, loop.diverged_step = DIVERGED, "diverged", self.step + 1
        loop.last_loss = loss
        if self._weights_finite():
            loop.last_good = self._save_checkpoint(loop.clock)
        else:
            loop.last_good = latest_checkpoint(self.out_dir)
        if self.main:
            print(
                f"diverged at step {loop.diverged_step}: loss {loss} (run.max_loss={max_loss}); "
                f"last good checkpoint: {loop.last_good}",
                flush=True,
            )

    def periodic(self, loop: _Loop, result: StepResult) -> bool:
        """After a step: log, evaluate and checkpoint when due; True when the run stops.
        Each decision is OR-ed over ranks, since evaluation and checkpoints are collective."""
        run_cfg, clock = self.recipe.run, loop.clock
        now = loop.step_end
        ckpt_every, eval_every = run_cfg.checkpoint_every_seconds, self.recipe.eval.every_seconds
        reason = self._stop_reason(clock)
        eval_local = eval_every is not None and now - loop.last_eval >= eval_every
        ckpt_local = ckpt_every is not None and now - loop.last_ckpt >= ckpt_every
        stop, eval_due, ckpt_due, interrupted = distributed.any_true(
            [bool(reason), eval_local, ckpt_local, self.stop_request.requested], self.device
        )
        if interrupted:  # Ctrl-C on any rank: this step's checkpoint, then stop
            return self._interrupted(loop, result)
        record: dict[str, Any] = {}
        # Every startup step too: a short run's first steps (compile, warm-up) are where a
        # person watches for signs of life.
        startup = self.step <= self.recipe.budget.startup_steps_excluded
        if self.step % run_cfg.log_every_steps == 0 or startup or stop or eval_due:
            record = self._record(loop, result.loss, now)
        if eval_due and not stop:
            record["val_bpb"] = self._evaluate()["val_bpb"]
            loop.last_eval = self.time_fn()
        if record:
            self.metrics.write(record)
            if self.main:
                print(_format_record(record, self.recipe.budget.seconds), flush=True)
        if ckpt_due and not stop:
            self._save_checkpoint(clock)
            loop.last_ckpt = self.time_fn()
        if stop:
            loop.stop_reason = reason or "budget"  # "": another rank's clock ran out
        return stop

    def _interrupted(self, loop: _Loop, result: StepResult) -> bool:
        """Ctrl-C asked for a stop: log this step and write its checkpoint, so that
        ``--resume`` repeats no step. Every rank is here (the decision was all-reduced)."""
        record = self._record(loop, result.loss, loop.step_end)
        self.metrics.write(record)
        loop.status, loop.stop_reason = INTERRUPTED, "interrupted"
        loop.last_good = self._save_checkpoint(loop.clock) or latest_checkpoint(self.out_dir)
        if self.main:
            print(_format_record(record, self.recipe.budget.seconds), flush=True)
            print(f"interrupted at step {self.step}: checkpoint {loop.last_good}", file=sys.stderr, flush=True)
        return True

    def _record(self, loop: _Loop, local_loss: float, now: float) -> dict[str, Any]:
        """One metrics.jsonl line (the loss averaged over ranks: a collective)."""
        clock = loop.clock
        loop.last_loss = distributed.mean(local_loss, self.device)
        step_seconds = clock.last_step_seconds
        tps = self.geometry.tokens / step_seconds if step_seconds > 0 else None
        record: dict[str, Any] = {
            "step": self.step,
            "loss": loop.last_loss,
            "lr": loop.lrm * self.matrix_lr,
            "lrm": loop.lrm,
            "tokens": self.tokens,
            "tokens_per_second": tps,
            "charged_seconds": clock.charged_seconds(),
            "elapsed_seconds": now - clock.start_time,
            "startup": clock.in_startup,
        }
        mfu = self._mfu(tps)
        if mfu is not None:
            record["mfu"] = mfu
        return record

    def finish(self, loop: _Loop) -> dict[str, Any]:
        """The final checkpoint and its trusted evaluation (completed runs), summary.json."""
        clock, e = loop.clock, self.recipe.eval
        accounting = clock.summary()
        tokens_per_second = None
        last_boundary = clock.last_boundary_time
        steady_from = loop.steady_from
        if steady_from is not None and last_boundary is not None and last_boundary > steady_from[1]:
            tokens_per_second = (self.tokens - steady_from[0]) / (last_boundary - steady_from[1])
        elif self.step:
            tokens_per_second = self.tokens / max(self.time_fn() - loop.started, 1e-9)
        self.metrics.close()

        final_path, evaluation = None, None
        if loop.status == COMPLETED:
            distributed.barrier()
            if self.main:
                final_path = self._save_final(clock)
            distributed.barrier()
            # The scored number comes from one process on one device, exactly as `trnf eval`
            # and the organisers' eval-public compute it: leave the process group first.
            distributed.shutdown()
            if self.main and e.final and final_path is not None:
                print(
                    f"{FINAL_EVAL_MARK} {e.tokens:,} tokens, the trusted evaluate_bpb of {final_path}",
                    flush=True,
                )
                evaluation = final_evaluation(
                    self.prepare, self.tokenizer, final_path, self.device, e
                )
        summary = self._summary(loop, accounting, tokens_per_second, final_path, evaluation)
        if self.main:
            atomic_write_json(self.out_dir / SUMMARY_FILE, summary)
            print(
                f"{loop.status}: {self.step} steps, startup {summary['startup_seconds']:.1f} s, charged "
                f"{summary['charged_seconds']:.1f} s, headroom {summary['headroom_seconds']:.1f} s, "
                f"over_budget={summary['over_budget']}, val_bpb={summary['val_bpb']}",
                flush=True,
            )
        return summary

    def _summary(
        self,
        loop: _Loop,
        accounting: dict[str, Any],
        tokens_per_second: float | None,
        final_path: Path | None,
        evaluation: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """summary.json of a completed or diverged run (rundir.RunSummary)."""
        e = self.recipe.eval
        return {
            "name": self.recipe.name,
            "status": loop.status,
            "stop_reason": loop.stop_reason,
            "val_bpb": evaluation["val_bpb"] if evaluation else None,
            "eval_tokens": e.tokens,
            "eval_seq_len": e.seq_len,
            "eval_batch_size": e.batch_size,
            "eval_num_tokens": evaluation["num_tokens"] if evaluation else None,
            "eval_num_bytes": evaluation["num_bytes"] if evaluation else None,
            "eval_seconds": evaluation["eval_seconds"] if evaluation else None,
            "params": self.params,
            "tokens": self.tokens,
            "steps": self.step,
            "tokens_per_second": tokens_per_second,
            "mfu": self._mfu(tokens_per_second),
            "final_loss": loop.last_loss if math.isfinite(loop.last_loss) else None,
            "charged_seconds": accounting["charged_seconds"],
            "startup_seconds": accounting["startup_seconds"],
            "compiled": self.compiled,
            "sharded_optimizer": self.sharded is not None,
            "host_memory_kept": self.host_memory_kept,
            "polar_dtype": str(muon.polar_dtype(self.device)).removeprefix("torch."),
            "first_step_seconds": self.first_step_seconds,
            "headroom_seconds": accounting["headroom_seconds"],
            "over_budget": accounting["over_budget"],
            "budget_seconds": float(self.recipe.budget.seconds),
            "device": self.spec.name,
            "kernels": self.kernels,
            "dtype": str(self.spec.dtype).removeprefix("torch."),
            "world_size": self.info.world_size,
            "versions": versions(),
            "speed_env": self.speed_env,
            "prepare_sha256": self.prepare_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
            "final_checkpoint": str(final_path) if final_path else None,
            "diverged_step": loop.diverged_step,
            "last_good_checkpoint": str(loop.last_good) if loop.last_good else None,
            "resumed_from": self.resumed_from,
        }


def final_evaluation(
    prepare: ModuleType,
    tokenizer: Any,
    checkpoint: Path,
    device: torch.device,
    eval_cfg: EvalSpec,
) -> dict[str, Any]:
    """The trusted evaluate_bpb of a saved checkpoint, as a scorer runs it: reloaded through
    load_for_eval (float32 weights, eval mode, one device), no autocast, one process.
    ``trnf eval`` loads through the same path and passes the same evaluate_bpb arguments
    (the run's recorded tokens, context and batch), so the two numbers agree to the last
    digit; tests/cli/test_eval_cli.py holds that equality."""
    model = ckpt.load_for_eval(str(checkpoint), device)
    return recipe_evaluate_bpb(prepare, model, tokenizer, device, eval_cfg)


def recipe_evaluate_bpb(
    prepare: ModuleType,
    model: nn.Module,
    tokenizer: Any,
    device: torch.device,
    eval_cfg: EvalSpec,
) -> dict[str, Any]:
    """The trusted ``evaluate_bpb`` with the recipe's ``eval`` batch size, context and
    token count. A name of its own, not ``evaluate_bpb``: screens treat calls by that name
    as the trusted scorer."""
    return prepare_calls.evaluate_bpb(
        prepare,
        model,
        tokenizer,
        int(eval_cfg.batch_size),
        int(eval_cfg.seq_len),
        device,
        max_tokens=int(eval_cfg.tokens),
    )


def _format_record(record: dict[str, Any], budget: float) -> str:
    parts = [f"step {record['step']}", f"loss {record['loss']:.4f}", f"lr {record['lr']:.3g}"]
    if record.get("tokens_per_second"):
        parts.append(f"{record['tokens_per_second']:,.0f} tok/s")
    if "mfu" in record:
        parts.append(f"mfu {100 * record['mfu']:.1f}%")
    parts.append(f"charged {record['charged_seconds']:.1f}/{budget:g} s")
    if "val_bpb" in record:
        parts.append(f"val_bpb {record['val_bpb']:.4f}")
    return " | ".join(parts)


def train(
    recipe: dict[str, Any] | ResolvedRecipe,
    out_dir: Path,
    resume: bool = False,
    step_log: Path | None = None,
    *,
    time_fn: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Train one run into ``out_dir`` and return its summary (also in summary.json).

    ``step_log``: where ``record_step_boundary`` appends (default
    ``out_dir/step_boundaries.jsonl``); a generated train.py passes the path its launcher
    set in ``TRNF_STEP_LOG`` (kit-mode `trnf train --train-py`, verify's dry run).
    ``time_fn``: see ``Trainer``; a fresh process (entry.py, a packaged train.py) leaves it None.
    ``recipe``: the resolved recipe, as plain data (recipe.json, a train.py's RECIPE) or typed.
    """
    if not isinstance(recipe, ResolvedRecipe):
        recipe = ResolvedRecipe.from_dict(recipe)
    out_dir = Path(out_dir).resolve()
    info = distributed.dist_info()
    runtime = recipe.runtime
    if runtime.threads:
        torch.set_num_threads(runtime.threads)
    if recipe.data.dataset:
        os.environ["TRNF_DATASET"] = recipe.data.dataset
    os.environ[STEP_LOG_ENV] = str(
        Path(step_log).resolve() if step_log else out_dir / STEP_LOG_FILE
    )
    if runtime.device in ("neuron", "auto"):
        os.environ.setdefault("NEURON_LOGICAL_NC_CONFIG", str(runtime.lnc))
    prepare = load_prepare()
    spec = devices.resolve(runtime, info.local_rank)
    lock = None
    if info.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        # One writer per run directory; refused before anything is written (a crash
        # summary here would overwrite the live writer's). Joins the lock `trnf train` took.
        lock = runlock.acquire(out_dir)
        if lock.took_over:
            print(lock.took_over, file=sys.stderr, flush=True)
    try:
        distributed.init(spec.device, info)
        try:
            trainer = Trainer(recipe, out_dir, resume, prepare, info, spec, time_fn=time_fn)
            return trainer.run()
        except BaseException as exc:
            if info.is_main and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                _write_crash_summary(out_dir, recipe, exc)
            raise
        finally:
            distributed.shutdown()
    finally:
        if lock is not None:
            lock.release()


def _warn(message: str) -> None:
    """A line on stderr that a full disk (stderr is train.log) cannot turn into a crash."""
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:
        pass


def _write_crash_summary(out_dir: Path, recipe: ResolvedRecipe, exc: BaseException) -> None:
    """A crashed run still leaves a summary naming what went wrong (no traceback parsing);
    ``expected_fault`` tells a fault the user can act on (its one line is the whole
    story) from a bug (whose traceback the user needs to see)."""
    line = fault_line(exc)
    try:
        write_crash_summary(
            out_dir,
            name=recipe.name,
            error=line or f"{type(exc).__name__}: {exc}",
            last_good_checkpoint=latest_checkpoint(out_dir),
            versions=versions(),
            expected_fault=line is not None,
        )
    except OSError:
        pass
