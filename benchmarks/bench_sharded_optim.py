"""Optimizer time per step: the sharded optimizer against today's replicated one, on CPU ranks.

    .venv/bin/python benchmarks/bench_sharded_optim.py [--worlds 2,4] [--rounds 7] [--steps 3]
        [--depth 4] [--width 256] [--out benchmarks/results/sharded_optim_DATE.json]

For each world size the script starts that many gloo ranks with torchrun (one thread
each). Every rank builds the same model (``--depth``/``--width``, vocabulary 8,192) and
its optimizers twice, then alternates rounds of ``--steps`` steps of:

- reference (``replicated``): what a step costs after backward under DDP today: the
  gradients all-reduced in one flat buffer (DDP's bucketed all-reduce, here not overlapped
  with a backward) and every optimizer stepped on every rank;
- ours (``sharded``): ``ShardedUpdate.step()``: reduce-scatter, each rank's share of
  Muon and AdamW, all-gather.

Each round's time is the slowest rank's (the step ends when the last rank does). Both
sides see the same gradients. ``ratio = replicated / sharded`` seconds per step (above 1:
sharding is faster), the median over rounds with the interquartile range; ``optimizer
only`` is the replicated side's optimizer step without its all-reduce, for scale.
Ranks share the machine's cores, so absolute times belong to the machine named in the
output; the ratio is the result.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.optim import build_optimizers
from trnfrontier.runtime.recipe import OptimSpec
from trnfrontier.runtime.sharded_optim import ShardedUpdate

REPO = Path(__file__).resolve().parents[1]
OPTIM = OptimSpec(matrix_lr=0.02, weight_decay=0.1, muon_momentum=0.95)


def _model(depth: int, width: int) -> GPT:
    torch.manual_seed(0)
    heads = max(1, width // 128)
    return GPT(GPTConfig(vocab_size=8192, sequence_len=256, n_layer=depth, n_head=heads, n_kv_head=heads, n_embd=width))


def _set_grads(model: GPT, step: int, rank: int) -> None:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen) * 0.01


def _replicated(model: GPT, opts: list[torch.optim.Optimizer], world: int) -> tuple[float, float]:
    """(seconds of all-reduce + step, seconds of the step alone) for one step."""
    started = time.perf_counter()
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads]).mul_(1.0 / world)
    dist.all_reduce(flat)
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))
    stepped = time.perf_counter()
    for opt in opts:
        opt.step()
    done = time.perf_counter()
    return done - started, done - stepped


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ref_model, our_model = _model(args.depth, args.width), _model(args.depth, args.width)
    ref_opts = build_optimizers(ref_model, OPTIM)
    update = ShardedUpdate(build_optimizers(our_model, OPTIM))
    rows: dict[str, list[float]] = {"replicated": [], "sharded": [], "optimizer_only": []}
    for round_ in range(args.rounds + 1):  # round 0 warms up both sides
        spent = {"replicated": 0.0, "sharded": 0.0, "optimizer_only": 0.0}
        for step in range(args.steps):
            _set_grads(ref_model, step, rank)
            dist.barrier()
            whole, opt_only = _replicated(ref_model, ref_opts, world)
            spent["replicated"] += _slowest(whole)
            spent["optimizer_only"] += _slowest(opt_only)
            _set_grads(our_model, step, rank)
            dist.barrier()
            started = time.perf_counter()
            update.step()
            spent["sharded"] += _slowest(time.perf_counter() - started)
        if round_:
            for key, value in spent.items():
                rows[key].append(value / args.steps)
    if rank == 0:
        ratios = [a / b for a, b in zip(rows["replicated"], rows["sharded"], strict=True)]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        result = {
            "world_size": world,
            "params": ref_model.num_params(),
            "muon_matrices": sum(len(b.params) for b in update.buckets),
            "seconds_per_step": {key: statistics.median(value) for key, value in rows.items()},
            "ratio_replicated_over_sharded": {"median": statistics.median(ratios), "q1": q[0], "q3": q[2], "rounds": ratios},
        }
        Path(args.result).write_text(json.dumps(result))
    dist.destroy_process_group()


def run_world(world: int, args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
            __file__, "--worker", "--result", str(result), "--rounds", str(args.rounds),
            "--steps", str(args.steps), "--depth", str(args.depth), "--width", str(args.width),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{world} ranks failed:\n{proc.stderr[-3000:]}")
        return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    doc = {
        "benchmark": "bench_sharded_optim",
        "date": datetime.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "load_average": os.getloadavg()},
        "shape": {"depth": args.depth, "width": args.width, "vocab": 8192},
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "worlds": [run_world(int(w), args) for w in args.worlds.split(",")],
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
