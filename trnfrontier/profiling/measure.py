"""Build a recipe's training step on a device and time it.

The step timed here is the trainer's own, built by the trainer's builder
(``trnfrontier.runtime.assembly``: model, kernels, optimizers, compile, ``TrainStep``) and
driven through its ``phase`` hook: per micro-batch fetch, forward (under the device's
autocast), backward; then the loss read, clipping and the optimizers. What is profiled is
what trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import statistics
import sys
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trnfrontier.errors import TrnfError
from trnfrontier.profiling import flops, phases
from trnfrontier.profiling.quiet import without_profiler_noise
from trnfrontier.progress import Steps
from trnfrontier.recipes import Recipe
from trnfrontier.runtime import assembly, devices, distributed, host_memory, prepare_calls
from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.recipe import DeviceName
from trnfrontier.runtime.step import TrainStep, no_phase

# Bytes per parameter a step holds besides activations: fp32 weight and gradient, AdamW's
# two moments (Muon keeps one; the larger is assumed).
_BYTES_PER_PARAM = 16
_OOM_MARKERS = ("out of memory", "failed to allocate", "cannot allocate memory", "resource_exhausted", "oom")


@dataclass
class Setup:
    """Everything one recipe's step needs, built once by ``runtime.assembly`` as the
    trainer builds it: one rank of a ``runtime.nproc`` run, in this process."""

    recipe: Recipe
    parts: assembly.Parts
    built: assembly.BuiltStep
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    data_source: str
    step: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def spec(self) -> devices.DeviceSpec:
        return self.parts.spec

    @property
    def model(self) -> GPT:
        return self.parts.model

    @property
    def stepper(self) -> TrainStep:
        return self.built.stepper

    @property
    def seq_len(self) -> int:
        return self.parts.geometry.seq_len

    @property
    def tokens_per_step(self) -> int:
        """The tokens this process (one rank) trains per step."""
        return self.parts.geometry.rank_tokens

    def sync(self) -> None:
        devices.synchronize(self.spec.device)


def benchmark_kernels(device: str) -> dict[str, Any]:
    """`--kernels`: trnfrontier.runtime.kernels.bench's rows on ``device`` (each kernel
    against its PyTorch reference, measured in the same run)."""
    try:
        from trnfrontier.runtime.kernels.bench import benchmark_kernels as bench
    except ImportError:
        raise TrnfError("`trnf profile --kernels` is not available yet: trnfrontier.runtime.kernels.bench has not landed") from None
    try:
        resolved = devices.resolve_device(device)
    except devices.DeviceError as exc:
        raise TrnfError(str(exc)) from None
    return {"device": str(resolved), "kernels": bench(resolved)}


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or any(m in str(exc).lower() for m in _OOM_MARKERS)


def does_not_fit(recipe: Recipe, device: str, detail: str) -> TrnfError:
    return TrnfError(
        f"recipe {recipe.name} does not fit in {device} memory ({detail}); "
        "lower data.batch_size (grad accumulation keeps total_batch_tokens) or the model size"
    )


def _available_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None  # Neuron: no query; an allocation failure is caught instead


def check_fits(recipe: Recipe, config: GPTConfig, device: torch.device) -> int:
    """Refuse, before allocating, a model whose weights, gradients and optimizer state alone
    exceed the device's free memory. Returns the parameter count (counted on the meta device)."""
    with torch.device("meta"):
        params = GPT(config).num_params()
    logits = recipe.data.batch_size * config.sequence_len * config.vocab_size * 4 * 3  # logits, softmax, grad
    needed = params * _BYTES_PER_PARAM + logits
    available = _available_bytes(device)
    if available is not None and needed > available:
        raise does_not_fit(
            recipe, str(device), f"{params / 1e6:,.1f}M parameters need at least {needed / 2**30:,.1f} GiB "
            f"for weights, gradients and optimizer state, {available / 2**30:,.1f} GiB free"
        )
    return params


def _batches(recipe: Recipe, device: torch.device, notes: list[str]) -> tuple[Iterator[tuple[torch.Tensor, torch.Tensor]], str]:
    """The contract's training dataloader when a dataset is prepared, else random tokens (said)."""
    B, T = recipe.data.batch_size, recipe.model.sequence_len
    if recipe.data.dataset:
        os.environ["TRNF_DATASET"] = recipe.data.dataset  # as the trainer selects it
    try:
        from trnfrontier.trusted_prepare import load_contract

        prepare = load_contract().module
        tokenizer = prepare_calls.ensure_tokenizer(prepare)
        if tokenizer.get_vocab_size() != recipe.model.vocab_size:
            raise ValueError(f"model.vocab_size={recipe.model.vocab_size} but the prepared tokenizer has {tokenizer.get_vocab_size()}")
        loader = prepare_calls.make_dataloader(prepare, tokenizer, B, T, "train", device)  # as the kit calls it

        def real() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            for inputs, targets, _state in loader:
                yield inputs, targets

        return real(), "prepare.make_dataloader (train split)"
    except Exception as exc:  # noqa: BLE001 - no prepared data is a normal state for profiling
        notes.append(f"data: random tokens, not the prepared data ({str(exc).splitlines()[0][:160]}); the loader is not timed")

    vocab = recipe.model.vocab_size
    generator = torch.Generator().manual_seed(recipe.runtime.seed)

    def synthetic() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            row = torch.randint(0, vocab, (B, T + 1), generator=generator)
            yield row[:, :-1].to(device), row[:, 1:].to(device)

    return synthetic(), "random tokens"


def build(recipe: Recipe, device: str | None = None) -> Setup:
    """The recipe's model, optimizers and step on ``device`` (default: the recipe's), as
    one rank of its ``runtime.nproc`` processes: that rank's share of a step's batch, the
    LRs of the whole run, no DDP (one process), its kernels."""
    resolved = recipe.resolved()
    # profiling/arguments.check_options has refused any --device but a DeviceName
    runtime = dataclasses.replace(resolved.runtime, device=typing.cast(DeviceName, device or resolved.runtime.device))
    try:
        spec = devices.resolve(runtime)
    except devices.DeviceError as exc:
        raise TrnfError(str(exc)) from None
    if spec.type == "cpu" and recipe.runtime.threads:
        torch.set_num_threads(recipe.runtime.threads)
    check_fits(recipe, GPTConfig.from_recipe(resolved.model), spec.device)
    notes: list[str] = []
    one_process = distributed.DistInfo(False, 0, 0, 1)
    with _refusals(recipe, spec):
        parts = assembly.build_parts(resolved, spec, one_process, world_size=recipe.runtime.nproc)
    batches, source = _batches(recipe, spec.device, notes)
    built = assembly.build_step(parts)
    if spec.type == "cpu" and not host_memory.kept():
        notes.append(
            "host memory: glibc's defaults here; trnf train starts CPU runs with "
            + " ".join(f"{k}={v}" for k, v in host_memory.KEEP_FREED.items())
            + " (set them to profile the same step)"
        )
    if built.compiled:
        notes.append(
            "runtime.compile: the loss and the optimizer updates are torch.compile'd; "
            "compilation falls in the warm-up steps"
        )
    return Setup(recipe, parts, built, batches, source, notes=notes)


@contextlib.contextmanager
def _refusals(recipe: Recipe, spec: devices.DeviceSpec) -> Iterator[None]:
    """An allocation failure or a kernel set to "on" that cannot run here, as one line."""
    try:
        yield
    except RuntimeError as exc:
        if _is_oom(exc):
            raise does_not_fit(recipe, spec.name, str(exc).splitlines()[0][:160]) from None
        from trnfrontier.runtime.kernels import KernelUnavailableError

        if isinstance(exc, KernelUnavailableError):
            raise TrnfError(str(exc)) from None
        raise


def train_step(setup: Setup, timer: phases.PhaseTimer | None = None) -> None:
    """One optimizer step (``accum`` micro-batches), the trainer's TrainStep, phase-timed
    when ``timer`` is given."""
    phase = timer.phase if timer is not None else no_phase
    with phase("optimizer"):
        # Mid-run progress, held: the schedule's cost, not its values, is what is timed.
        setup.parts.schedule(setup.step, 0.5)
    setup.stepper.take(lambda micro: (*next(setup.batches), None), phase=phase)
    setup.step += 1


def guarded(setup: Setup, action: Callable[[], Any]) -> Any:
    """Run ``action``; an allocation failure becomes the one-line does-not-fit error."""
    try:
        return action()
    except RuntimeError as exc:
        if _is_oom(exc):
            raise does_not_fit(setup.recipe, setup.spec.name, str(exc).splitlines()[0][:160]) from None
        raise


def timed_plain_step(setup: Setup) -> float:
    setup.sync()
    started = time.perf_counter()
    train_step(setup)
    setup.sync()
    return time.perf_counter() - started


def warm_up(setup: Setup, steps: int, progress: Steps | None = None) -> None:
    for _ in range(steps):
        guarded(setup, lambda: train_step(setup))
        if progress is not None:
            progress.advance()
    setup.sync()


def peak_memory(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        return {"bytes": torch.cuda.max_memory_allocated(device), "source": "torch.cuda.max_memory_allocated (this run)"}
    if device.type == "cpu":
        # ru_maxrss is KiB on Linux, bytes on macOS.
        scale = 1 if sys.platform == "darwin" else 1024
        return {"bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale, "source": "process peak RSS (includes Python and torch)"}
    return {"bytes": None, "source": f"not reported by the {device.type} backend through torch"}


def top_operators(
    setup: Setup, steps: int, top: int, trace: Path | None, progress: Steps | None = None
) -> list[dict[str, Any]]:
    """Self time per operator from torch.profiler over ``steps`` extra steps (kept out of
    the timed steps: the profiler's own overhead would distort them)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if setup.spec.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with without_profiler_noise(), profile(activities=activities, record_shapes=False) as prof:
        for _ in range(steps):
            guarded(setup, lambda: train_step(setup))
            if progress is not None:
                progress.advance()
        setup.sync()
    if trace is not None:
        try:
            trace.parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace))
        except OSError as exc:
            raise TrnfError(f"--trace {trace}: cannot write it ({exc.strerror or exc})") from None
    device_attr = "self_device_time_total" if setup.spec.type == "cuda" else None
    rows = []
    for event in prof.key_averages():
        self_cpu = event.self_cpu_time_total
        self_device = getattr(event, device_attr, 0.0) if device_attr else 0.0
        rows.append({"name": event.key, "calls": event.count, "self_cpu_us": self_cpu, "self_device_us": self_device})
    key = "self_device_us" if device_attr and any(r["self_device_us"] for r in rows) else "self_cpu_us"
    total = sum(r[key] for r in rows) or 1.0
    rows.sort(key=lambda r: r[key], reverse=True)
    for r in rows:
        r["share"] = r[key] / total
        r["per_step_us"] = r[key] / max(1, steps)
    return [dict(r, sorted_by=key) for r in rows[:top]]


def neuron_profiler_view(device: torch.device) -> str:
    """What the Neuron profiler can add; never pretends to have run it."""
    if device.type != "neuron":
        return f"not applicable (device {device.type})"
    import importlib.util

    if importlib.util.find_spec("torch_neuronx") is None:
        return "not installed (torch-neuronx from AWS's Neuron pip repository)"
    return (
        "installed; for the device timeline capture a run with NEURON_RT_INSPECT_ENABLE=1 "
        "NEURON_RT_INSPECT_OUTPUT_DIR=./neuron_profile and open it with `neuron-profile view`"
    )


def projection(recipe: Recipe, tokens_per_second: float, params: int) -> dict[str, Any]:
    """What the budget buys at this throughput (train seconds = budget - checkpoint reserve)."""
    seconds = max(0.0, recipe.budget.seconds - recipe.budget.checkpoint_reserve_seconds)
    nproc = recipe.runtime.nproc
    total_tps = tokens_per_second * nproc
    tokens = total_tps * seconds
    per_step = assembly.batch_geometry(recipe.resolved(), nproc).tokens
    return {
        "train_seconds": seconds,
        "nproc": nproc,
        "tokens_per_second_all_processes": total_tps,
        "assumption": f"measured single-process throughput x nproc={nproc} (linear scaling)" if nproc > 1 else "measured throughput",
        "tokens": tokens,
        "steps": tokens / per_step,
        "tokens_per_step": per_step,
        "tokens_per_param": tokens / params if params else None,
    }


PROFILER_STEPS = 2


def profile_units(steps: int, warmup: int, profiler_steps: int = PROFILER_STEPS) -> int:
    """How many units of progress ``profile`` reports: every step it takes, and the peak probe."""
    return warmup + 2 * steps + profiler_steps + 1


def profile(setup: Setup, steps: int, warmup: int, top: int = 12, trace: Path | None = None,
            profiler_steps: int = PROFILER_STEPS, progress: Steps | None = None) -> dict[str, Any]:
    """Warm up, then ``steps`` plain steps interleaved with ``steps`` phase-split ones."""
    bar = progress or Steps.none()
    spec = setup.spec
    if spec.type == "cuda":
        torch.cuda.reset_peak_memory_stats(spec.device)
    bar.describe(f"{setup.recipe.name}: warm-up")
    warm_up(setup, warmup, bar)
    bar.describe(f"{setup.recipe.name}: timing steps (plain and phase-split)")
    timer = phases.PhaseTimer(setup.sync)
    plain: list[float] = []
    split: list[dict[str, float]] = []
    dispatch: list[dict[str, float]] = []

    def split_step() -> None:
        timer.start_step()
        train_step(setup, timer)
        split.append(timer.end_step())
        dispatch.append(dict(timer.dispatch))

    for i in range(steps):
        # Alternate which comes first, so neither kind always follows the other.
        if i % 2 == 0:
            plain.append(guarded(setup, lambda: timed_plain_step(setup)))
            guarded(setup, split_step)
        else:
            guarded(setup, split_step)
            plain.append(guarded(setup, lambda: timed_plain_step(setup)))
        bar.advance(2)
    memory = peak_memory(spec.device)
    bar.describe(f"{setup.recipe.name}: top operators (torch.profiler)")
    ops = top_operators(setup, profiler_steps, top, trace, bar)

    lnc = setup.recipe.runtime.lnc
    bar.describe(f"{setup.recipe.name}: measuring the device peak")
    peak = flops.device_peak(spec.device, spec.dtype, lnc)
    bar.advance()
    step_seconds = statistics.median(plain)
    tokens_per_second = setup.tokens_per_step / step_seconds
    fpt = setup.model.flops_per_token(setup.seq_len)
    achieved = fpt * tokens_per_second
    params = setup.model.num_params()
    c = setup.model.config
    result: dict[str, Any] = {
        "recipe": setup.recipe.name,
        "device": spec.name,
        "dtype": flops.dtype_name(spec.dtype),
        "threads": torch.get_num_threads() if spec.type == "cpu" else None,
        "data_source": setup.data_source,
        "warmup_steps": warmup,
        "steps": steps,
        "accum": setup.parts.geometry.accum,
        "batch_size": setup.parts.geometry.batch_size,
        "seq_len": setup.seq_len,
        "tokens_per_step": setup.tokens_per_step,
        "step_seconds_all": plain,
        "step_seconds_spread": [min(plain), max(plain)],
        "tokens_per_second": tokens_per_second,
        "params": params,
        "embedding_params": setup.model.num_embedding_params(),
        "flops_per_token": fpt,
        "flops_formula": flops.FLOPS_FORMULA,
        "flops_terms": {"n_layer": c.n_layer, "n_head": c.n_head, "head_dim": c.head_dim, "seq_len": setup.seq_len},
        "achieved_tflops": achieved / 1e12,
        "peak_tflops": peak.flops / 1e12 if peak.flops else None,
        "peak_source": peak.source,
        "mfu": flops.mfu(fpt, tokens_per_second, peak),
        "peak_memory": memory,
        "top_operators": ops,
        "neuron_profiler": neuron_profiler_view(spec.device),
        "communication_note": "single process: no gradient all-reduce measured (a torchrun DDP run adds it, overlapped with backward)",
        "projection": projection(setup.recipe, tokens_per_second, params),
        "trace": str(trace) if trace else None,
        "notes": setup.notes,
    }
    result.update(phases.summarize(split, dispatch, plain))
    return result

