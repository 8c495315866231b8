"""trnf with its defaults against nanochat as its scripts/base_train.py builds it, on one CPU
shape, each in its own process, their steps interleaved in lockstep (load hits both alike).

Shape (issue 15): depth 4, width 256, 4 heads of 64, context 256, 8,192 tokens per step
(32 rows, no accumulation), float32, ``--threads`` threads. Both sides read the same
batches from the prepared dataset (``make_dataloader``) and are scored by the same
``evaluate_bpb`` at equal tokens.

- trnf: ``recipes/tinyshakespeare.yaml`` resolved with the schema's defaults
  (``runtime.compile: auto``, fused chunked loss, batch-scaled LRs) in ``steps`` mode over
  ``--steps``; built by the trainer's own builder (``runtime/assembly.py``: model,
  optimizers, compiled ``TrainStep``, schedule), with the trainer's host-memory policy
  (``runtime/host_memory.py``, which is process-wide: hence a process per side).
- nanochat: a checkout of github.com/karpathy/nanochat (``--nanochat DIR``; the commit is
  pinned in benchmarks/requirements-bench.txt: the ``nanochat`` name on PyPI is a
  different package that ships only its BPE tokenizer). Model on meta -> ``to_empty`` ->
  ``init_weights``, ``torch.compile(dynamic=False)``, ``setup_optimizer`` with base_train's
  LRs x sqrt(B / 2^19) and scaled weight decay, its warm-up / warm-down / momentum / weight
  decay schedules over ``--steps``.

Prints one JSON object: per side tokens/s (median, IQR) over the steady steps (the first
``--warmup`` steps of each seed carry compilation and are left out), the paired per-step
ratio trnf / nanochat (median, IQR), val bpb per seed and its mean, each side's peak RSS
while training, the compile (first-step) seconds, and /proc/loadavg. A step's time is the
optimizer step alone (forward, backward, update); the data loader runs outside it.

    TRNF_HOME=... .venv/bin/python benchmarks/bench_vs_nanochat.py --nanochat ~/src/nanochat \
        [--steps 48] [--seeds 3] [--threads 2] [--eval-tokens 32768]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

B, T, DEPTH, WIDTH, HEAD_DIM = 32, 256, 4, 256, 64
NANOCHAT_B_REF = 2**19


def quartiles(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": q[1], "q1": q[0], "q3": q[2], "n": len(xs)}


# ---------------------------------------------------------------- trnf


def trnf_recipe(steps: int, seed: int) -> Any:
    from trnfrontier.recipes.loading import (
        apply_overrides,
        parse_overrides,
        read_recipe_file,
        validate_recipe,
    )

    data = read_recipe_file(REPO / "recipes" / "tinyshakespeare.yaml")
    overrides = ["schedule.mode=steps", f"schedule.total_steps={steps}", f"runtime.seed={seed}"]
    data = apply_overrides(data, parse_overrides(overrides))
    return validate_recipe(data, "bench").resolved()


class TrnfSide:
    name = "trnf"

    def __init__(self, seed: int, steps: int) -> None:
        from trnfrontier.runtime import assembly, devices, distributed, host_memory, muon

        self.recipe = r = trnf_recipe(steps, seed)
        # Built as the trainer builds it (runtime/assembly.py), in this one process.
        self.parts = assembly.build_parts(r, devices.resolve(r.runtime), distributed.DistInfo(False, 0, 0, 1))
        built = assembly.build_step(self.parts)
        self.stepper, self.compiled = built.stepper, built.compiled
        self.host_memory_kept = host_memory.kept()  # run_seed starts this process as trnf train does
        self.polar_dtype = str(muon.CPU_POLAR_DTYPE).removeprefix("torch.")
        self.step_index = 0

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        from trnfrontier.runtime.schedule import progress_from_steps

        self.parts.schedule(self.step_index, progress_from_steps(self.step_index, int(self.recipe.schedule.total_steps)))
        result = self.stepper.take(lambda micro: (x, y, None))
        self.step_index += 1
        return result.loss

    def eval_model(self) -> torch.nn.Module:
        return self.parts.model


# ---------------------------------------------------------------- nanochat


class NanochatSide:
    name = "nanochat"

    def __init__(self, seed: int, steps: int, vocab: int) -> None:
        from nanochat.gpt import GPT, GPTConfig  # type: ignore[import-not-found]

        torch.manual_seed(seed)
        config = GPTConfig(sequence_len=T, vocab_size=vocab, n_layer=DEPTH, n_head=WIDTH // HEAD_DIM, n_kv_head=WIDTH // HEAD_DIM, n_embd=WIDTH)
        with torch.device("meta"):
            model = GPT(config)
        model.to_empty(device="cpu")
        model.init_weights()
        self.orig = model
        self.model = torch.compile(model, dynamic=False)
        self.window_pattern = config.window_pattern
        # base_train: LRs x sqrt(B / B_ref); weight decay x sqrt(B / B_ref) x (D_ref / D).
        scale = math.sqrt(B * T / NANOCHAT_B_REF)
        counts = model.num_scaling_params()
        target_tokens = 12 * (counts["transformer_matrices"] + counts["lm_head"])
        with torch.device("meta"):
            ref_counts = GPT(GPTConfig(sequence_len=T, vocab_size=vocab, n_layer=12, n_head=6, n_kv_head=6, n_embd=768)).num_scaling_params()
        d_ref = 12 * (ref_counts["transformer_matrices"] + ref_counts["lm_head"])
        self.weight_decay = 0.28 * scale * (d_ref / target_tokens)
        self.optimizer = model.setup_optimizer(
            unembedding_lr=0.008 * scale, embedding_lr=0.3 * scale, scalar_lr=0.5 * scale, matrix_lr=0.02 * scale, weight_decay=self.weight_decay
        )
        self.steps, self.step_index = steps, 0

    def _schedules(self, it: int) -> tuple[float, float, float]:
        """base_train's get_lr_multiplier, get_muon_momentum and get_weight_decay."""
        n, warmup, warmdown = self.steps, 40, round(0.65 * self.steps)
        if it < warmup:
            lrm = (it + 1) / warmup
        elif it <= n - warmdown:
            lrm = 1.0
        else:
            progress = (n - it) / warmdown
            lrm = progress + (1 - progress) * 0.05
        if it < 400:
            mom = (1 - it / 400) * 0.85 + it / 400 * 0.97
        elif it >= n - warmdown:
            progress = (it - (n - warmdown)) / warmdown
            mom = 0.97 * (1 - progress) + 0.90 * progress
        else:
            mom = 0.97
        wd = self.weight_decay * 0.5 * (1 + math.cos(math.pi * it / n))
        return lrm, mom, wd

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        loss = self.model(x, y)
        loss.backward()
        lrm, mom, wd = self._schedules(self.step_index)
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] * lrm
            if group["kind"] == "muon":
                group["momentum"], group["weight_decay"] = mom, wd
        self.optimizer.step()
        self.orig.zero_grad(set_to_none=True)
        self.step_index += 1
        return float(loss.item())

    def eval_model(self) -> torch.nn.Module:
        return self.orig


# ---------------------------------------------------------------- the run


def batches(prepare: Any, tokenizer: Any, seed: int):
    loader = prepare.make_dataloader(tokenizer, B, T, "train")
    for _ in range(seed):  # each seed starts at another place in the data
        next(loader)
    for x, y, _state in loader:
        yield x.contiguous(), y.contiguous()  # nanochat views the targets flat


def side_worker(name: str, seed: int, args: dict[str, Any], conn: Any) -> None:
    """One side in its own process (spawned), driven step by step over ``conn``: what a
    process-wide setting of either tool (trnf's host-memory policy) changes stays on its
    side, as in two separate training runs."""
    sys.stdout = sys.stderr  # what a side prints (nanochat's setup notes) stays off the JSON
    sys.path.insert(0, args["nanochat"])
    torch.set_num_threads(args["threads"])
    prepare, tokenizer = load_data()
    steps = args["steps"]
    side = TrnfSide(seed, steps) if name == "trnf" else NanochatSide(seed, steps, tokenizer.get_vocab_size())
    data = batches(prepare, tokenizer, seed)
    conn.send("ready")
    losses: list[float] = []
    while (command := conn.recv()) != "stop":
        if command == "step":
            x, y = next(data)  # the loader's time is not the step's
            start = time.perf_counter()
            losses.append(side.step(x, y))
            conn.send(time.perf_counter() - start)
        elif command == "finish":
            peak = peak_rss_mib()  # training's high-water mark, before the evaluation
            model = side.eval_model()
            model.eval()
            with torch.no_grad():
                result = prepare.evaluate_bpb(model, tokenizer, B, seq_len=T, max_tokens=args["eval_tokens"])
            conn.send({"val_bpb": result["val_bpb"], "peak_rss_mib": peak, "final_train_loss": statistics.fmean(losses[-5:]),
                       **({"window_pattern": side.window_pattern} if name == "nanochat" else {"compiled": side.compiled, "host_memory_kept": side.host_memory_kept,
                                                                                           "polar_dtype": side.polar_dtype})})


def run_seed(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    from trnfrontier.runtime import host_memory

    ctx = mp.get_context("spawn")
    workers = {}
    for name in ("trnf", "nanochat"):
        here, there = ctx.Pipe()
        proc = ctx.Process(target=side_worker, args=(name, seed, vars(args), there))
        # trnf train starts a CPU run with glibc keeping freed blocks (runtime/host_memory.py);
        # nanochat's base_train is started with the environment as it is.
        with mock.patch.dict(os.environ, host_memory.keep_freed_env("cpu") if name == "trnf" else {}):
            proc.start()
        workers[name] = (proc, here)
    try:
        for _proc, conn in workers.values():
            if conn.recv() != "ready":
                raise RuntimeError("a side failed to start")
        times: dict[str, list[float]] = {name: [] for name in workers}
        order = list(workers)
        for i in range(args.steps):
            for name in order if i % 2 == 0 else order[::-1]:  # alternate who goes first
                workers[name][1].send("step")
                times[name].append(workers[name][1].recv())
        out: dict[str, Any] = {"seed": seed}
        for name, (_proc, conn) in workers.items():
            conn.send("finish")
            out[name] = {**conn.recv(), "first_step_seconds": times[name][0], "step_seconds": times[name]}
            conn.send("stop")
    finally:
        for proc, _conn in workers.values():
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    return out


def peak_rss_mib() -> float:
    """This process's resident high-water mark. VmHWM, not ru_maxrss: Linux carries
    ru_maxrss across exec, so a spawned child would report its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_data() -> tuple[Any, Any]:
    from trnfrontier.runtime.prepare_loader import load_prepare

    prepare = load_prepare(REPO / "prepare.py")
    return prepare, prepare.ensure_tokenizer()


def summarise(seeds: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    steady = {name: [t for s in seeds for t in s[name]["step_seconds"][warmup:]] for name in ("trnf", "nanochat")}
    ratios = [n / t for s in seeds for t, n in zip(s["trnf"]["step_seconds"][warmup:], s["nanochat"]["step_seconds"][warmup:], strict=True)]
    tps = {name: quartiles([B * T / t for t in ts]) for name, ts in steady.items()}
    bpb = {name: [s[name]["val_bpb"] for s in seeds] for name in ("trnf", "nanochat")}
    return {
        "tokens_per_second": tps,
        "ratio_trnf_over_nanochat": quartiles(ratios),
        "val_bpb": {name: {"per_seed": v, "mean": statistics.fmean(v)} for name, v in bpb.items()},
        "first_step_seconds": {name: [s[name]["first_step_seconds"] for s in seeds] for name in ("trnf", "nanochat")},
        "final_train_loss": {name: [s[name]["final_train_loss"] for s in seeds] for name in ("trnf", "nanochat")},
        # Training's resident high-water mark, each side in its own process (max over seeds).
        "peak_rss_mib": {name: max(s[name]["peak_rss_mib"] for s in seeds) for name in ("trnf", "nanochat")},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanochat", default=os.environ.get("NANOCHAT_SRC"), help="a nanochat checkout (the folder holding nanochat/gpt.py)")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5, help="steps per seed left out of tokens/s (compilation)")
    parser.add_argument("--eval-tokens", type=int, default=24576)
    args = parser.parse_args()
    if not args.nanochat or not (Path(args.nanochat) / "nanochat" / "gpt.py").is_file():
        print("bench_vs_nanochat: give --nanochat DIR (a checkout of github.com/karpathy/nanochat; see benchmarks/requirements-bench.txt)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(args.nanochat).resolve()))
    torch.set_num_threads(args.threads)
    load_before = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    args.nanochat = str(Path(args.nanochat).resolve())
    started = time.time()
    seeds = []
    for seed in range(args.seeds):
        seeds.append(run_seed(seed, args))
        # Each seed as it finishes (stderr), so a long run on a loaded machine shows progress.
        print(json.dumps({"seed_done": seed, **seeds[-1]}), file=sys.stderr, flush=True)
    result = {
        "shape": {"depth": DEPTH, "width": WIDTH, "heads": WIDTH // HEAD_DIM, "head_dim": HEAD_DIM, "seq": T, "tokens_per_step": B * T, "dtype": "float32", "threads": args.threads},
        "steps_per_seed": args.steps,
        "seeds": args.seeds,
        **summarise(seeds, args.warmup),
        "nanochat_window_pattern": seeds[0]["nanochat"]["window_pattern"],
        "trnf_compiled": seeds[0]["trnf"]["compiled"],
        "trnf_host_memory_kept": seeds[0]["trnf"]["host_memory_kept"],
        "trnf_polar_dtype": seeds[0]["trnf"]["polar_dtype"],
        "wall_seconds": time.time() - started,
        "loadavg_before": load_before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "cpus": os.cpu_count()},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
