"""Ray is the engine: an embedded local Ray sized to this machine by default, a running
cluster with ``--address``; Ray Tune chooses the trials (grid, random, Optuna's TPE),
places them on free resources (CPUs, GPUs, ``neuron_cores``: Ray sets
``CUDA_VISIBLE_DEVICES`` / ``NEURON_RT_VISIBLE_CORES`` for each trial), stops poor ones
early (ASHA) and saves the search's state so that a killed sweep resumes.

trnf schedules nothing itself: no pool, no queue. It builds the Tuner, watches its
events (``Progress``) and writes them to ``sweep.json``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trnfrontier.contract.kit import ENV_PREFIX as KIT_ENV_PREFIX
from trnfrontier.errors import TrnfError
from trnfrontier.sweep import state as st
from trnfrontier.sweep.space import params_of, tune_space
from trnfrontier.sweep.spec import SweepSpec
from trnfrontier.sweep.trial import SETTLE_SECONDS, Job, run_trial

INSTALL_HINT = "`trnf sweep` needs Ray Tune: pip install 'trnfrontier[sweep]' (or: pip install 'ray[tune]' optuna)"
# Forwarded to trials on a cluster (a local Ray's workers inherit the driver's environment).
FORWARD_PREFIXES = ("TRNF_", "NEURON_CC_FLAGS", "NEURON_COMPILE_CACHE_URL", KIT_ENV_PREFIX)
# The embedded Ray's shared-memory object store: trials pass no data through it.
OBJECT_STORE_BYTES = 128 * 1024 * 1024
Say = Callable[[str], None]


def say_line(line: str) -> None:
    """A progress line on stderr (module level: Ray Tune pickles the callback holding it)."""
    from trnfrontier.console import err

    err().print(line, highlight=False, markup=False)


def import_tune() -> Any:
    try:
        from ray import tune
    except ImportError:
        raise TrnfError(INSTALL_HINT, exit_code=2) from None
    return tune


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k.startswith(FORWARD_PREFIXES) and k != "TRNF_SUPERVISOR"}


def start_ray(address: str | None) -> None:
    """Join ``address`` (``auto``: the cluster `ray start` made here), or start an
    embedded Ray with this machine's CPUs (GPUs and NeuronCores are detected by Ray)."""
    import ray

    if ray.is_initialized():
        return
    # Ray's own notices (token authentication, ...) are not the user's business; errors are.
    common: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    try:
        if address:
            ray.init(address=address, runtime_env={"env_vars": forwarded_env()}, **common)
        else:
            ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=OBJECT_STORE_BYTES, **common)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = f"--address {address}" if address else "an embedded Ray"
        raise TrnfError(f"could not start {where}: {exc}".splitlines()[0]) from None


def resources_of(spec: SweepSpec) -> dict[str, float]:
    chosen = {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu, "neuron_cores": float(spec.resources.neuron_cores)}
    return {key: value for key, value in chosen.items() if value > 0 or key == "cpu"}


def check_fits(spec: SweepSpec) -> None:
    """A trial that needs more than the whole cluster has would wait forever: say so now."""
    import ray

    total = ray.cluster_resources()
    for key, need in resources_of(spec).items():
        have = total.get("CPU" if key == "cpu" else "GPU" if key == "gpu" else key, 0.0)
        if need > have:
            raise TrnfError(
                f"resources.{key}: each trial needs {need:g}, the Ray cluster has {have:g}; lower it or join a "
                "cluster that has them with --address",
                exit_code=2,
            )


def _searcher(spec: SweepSpec) -> Any:
    if spec.search == "optuna":
        try:
            from ray.tune.search.optuna import OptunaSearch
        except ImportError:
            raise TrnfError(f"search: optuna needs the optuna package; {INSTALL_HINT}", exit_code=2) from None
        try:
            import optuna  # noqa: F401 - OptunaSearch imports it only when built
        except ImportError:
            raise TrnfError(f"search: optuna needs the optuna package; {INSTALL_HINT}", exit_code=2) from None
        return OptunaSearch(metric=spec.metric, mode=spec.direction, seed=spec.search_seed)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=spec.search_seed, max_concurrent=spec.concurrency)


def _scheduler(spec: SweepSpec) -> Any:
    if spec.early_stop is None:
        return None
    from ray.tune.schedulers import ASHAScheduler

    stop = spec.early_stop
    grace = max(1, round(stop.grace_period * stop.reports))
    return ASHAScheduler(
        time_attr="training_iteration", metric="train_loss", mode="min",
        max_t=stop.reports, grace_period=min(grace, stop.reports), reduction_factor=stop.reduction_factor,
    )  # fmt: skip


def _trainable(job: Job, spec: SweepSpec) -> Any:
    tune = import_tune()

    def trial(config: dict[str, Any]) -> None:
        run_trial(job, config)

    return tune.with_resources(trial, resources_of(spec))


class Progress:
    """Ray Tune's events -> sweep.json and one line each on the console (lazily a
    ``ray.tune.Callback``: this module must import without Ray)."""

    def __init__(self, folder: str, spec: SweepSpec, job: Job, say: Say) -> None:
        self.folder, self.spec, self.job, self.say = folder, spec, job, say

    def state(self) -> st.SweepState:
        return st.load_state(Path(self.folder))

    def trial_started(self, trial: Any) -> None:
        sweep = self.state()
        params = params_of(self.spec, trial.config)
        sweep.update(trial.trial_id, params=params, run_dir=self.job.run_dir(trial.trial_id).name, status=st.RUNNING,
                     started=time.time(), error=None)  # fmt: skip
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        self.say(f"trial {trial.trial_id} started: {shown}")
        self.summary_line(sweep)

    def trial_result(self, trial: Any, result: dict[str, Any]) -> None:
        sweep = self.state()
        sweep.update(trial.trial_id, fraction=result.get("fraction"), train_loss=result.get("train_loss"))

    def trial_ended(self, trial: Any, error: str | None) -> None:
        sweep = self.state()
        last = trial.last_result or {}
        if error is not None:
            status = st.FAILED
        elif self.spec.metric in last or last.get("fraction") == 1.0:
            status = st.COMPLETED
        else:
            status = st.STOPPED
        sweep.update(trial.trial_id, status=status, error=error, finished=time.time())
        where = f" at {last.get('fraction', 0):.0%} of its budget (train loss {last.get('train_loss', float('nan')):.4f})" if status == st.STOPPED else ""
        if status == st.STOPPED:
            # Never waited for here: Ray ends the trial's worker only after this returns.
            sweep.update(trial.trial_id, note=f"stopped early by the sweep's ASHA{where}")
            self.close_stopped(sweep, wait=0.0)
        self.say(f"trial {trial.trial_id} {status}{where}" + (f": {error}" if error else ""))
        self.summary_line(sweep)

    def close_stopped(self, sweep: st.SweepState, wait: float) -> None:
        """Write the summaries of stopped trials whose processes are gone (trial.close_stopped_run)."""
        from trnfrontier.sweep.trial import close_stopped_run

        for trial_id, trial in sweep.trials.items():
            if trial.get("status") == st.STOPPED and trial.get("note"):
                close_stopped_run(self.job.run_dir(trial_id), str(trial["note"]), self.say, wait=wait)

    def summary_line(self, sweep: st.SweepState) -> None:
        from trnfrontier.sweep.report import progress_line

        self.say(progress_line(sweep, self.spec))


def _callback(progress: Progress, job: Job) -> Any:
    tune = import_tune()

    class Events(tune.Callback):  # type: ignore[name-defined]
        def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            progress.trial_started(trial)

        def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any) -> None:
            progress.trial_result(trial, result)

        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            progress.trial_ended(trial, None)

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            progress.trial_ended(trial, _error_of(trial, job))

    return Events()


def _error_of(trial: Any, job: Job) -> str:
    """A failed trial's error line: the one it failed with, else its run directory's."""
    from trnfrontier.sweep.trial import failure_of

    return failure_of(job.run_dir(trial.trial_id), job.log(trial.trial_id))


def run(sweep: st.SweepState, spec: SweepSpec, address: str | None, resume: bool, say: Say) -> None:
    """Run (or resume) the sweep to its end; Ctrl-C stops it (resumable)."""
    tune = import_tune()
    # Ray Tune saves the search's state at most this often: a killed driver loses at most
    # this much of it (and a trial's run directory is what counts in any case).
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    # Intermediate reports carry the training loss; the metric comes with the last one.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Ctrl-C stops the driver (KeyboardInterrupt, `trnf: interrupted`), as kill does; Ray
    # Tune's own handler would end the search quietly, as if it had finished.
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    start_ray(address)
    check_fits(spec)
    sweep.driver_started = time.time()
    sweep.save()
    job = Job(sweep.sweep_id, str(sweep.folder.resolve()), spec, os.getcwd(), forwarded_env() if address else {})
    trainable = _trainable(job, spec)
    progress = Progress(str(sweep.folder), spec, job, say)
    events = _callback(progress, job)
    if resume and tune.Tuner.can_restore(str(sweep.tune_path)):
        tuner = tune.Tuner.restore(str(sweep.tune_path), trainable, resume_unfinished=True, resume_errored=False,
                                   restart_errored=False, param_space=tune_space(spec))  # fmt: skip
        _replace_callbacks(tuner, events)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=tune_space(spec),
            tune_config=tune.TuneConfig(
                search_alg=_searcher(spec), scheduler=_scheduler(spec),
                num_samples=spec.trials or 1, reuse_actors=False,
                # The basic generator limits itself (max_concurrent); Optuna through Tune's limiter.
                max_concurrent_trials=spec.concurrency if spec.search == "optuna" else None,
            ),
            run_config=tune.RunConfig(
                name=st.TUNE_NAME, storage_path=str((sweep.folder / st.TUNE_DIR).resolve()), verbose=0,
                callbacks=[events], failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            ),
        )  # fmt: skip
    tuner.fit()
    progress.close_stopped(st.load_state(sweep.folder), wait=SETTLE_SECONDS)


def _replace_callbacks(tuner: Any, events: Any) -> None:
    """A restored Tuner brings the callbacks pickled with it (the killed driver's); this
    driver's own take their place, so events land here."""
    internal = getattr(tuner, "_local_tuner", None)
    run_config = getattr(internal, "_run_config", None)
    if run_config is not None:
        run_config.callbacks = [events]
