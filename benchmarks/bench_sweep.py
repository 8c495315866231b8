"""What `trnf sweep` buys and costs: N tiny trials through Ray against the same N runs
one after another with `trnf train`, in the same process, alternating, for several rounds.

    .venv/bin/python benchmarks/bench_sweep.py [--trials 4] [--concurrency 2] [--rounds 2] [--steps 8]
        [--out benchmarks/results/sweep_DATE.json]

Each round measures, in this order:
- ``sequential``: the N runs by `trnf train`, one after another (the reference);
- ``sweep_1``: the same N trials through `trnf sweep` at concurrency 1: what Ray adds,
  start-up included, with nothing gained from parallelism;
- ``sweep_k``: the same N trials at concurrency k (one CPU each).
- ``ray_start``: an embedded Ray started and stopped alone (part of every sweep's cost).

Reports wall seconds per round, the ratios ``sequential / sweep_k`` (speed-up; above 1 the
sweep is faster) and ``sweep_1 / sequential`` with 95% intervals over the rounds (log
scale, Welch), and Ray's overhead per trial ``(sweep_1 - sequential) / N``. Trials are the
tiny cpu_smoke model on the offline sample corpus (a private TRNF_HOME), compile off, one
thread each. Prints one JSON document and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from trnfrontier import stats
from trnfrontier.runtime.prepare_loader import load_prepare

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "model.depth=1", "model.n_embd=64", "model.head_dim=32", "model.n_kv_head=1", "model.sequence_len=32",
    "data.batch_size=4", "runtime.threads=1", "eval.tokens=2048", "eval.seq_len=32", "eval.batch_size=8",
    "budget.startup_steps_excluded=1", "run.checkpoint_every_seconds=null",
]  # fmt: skip


def _trnf(args: list[str], env: dict[str, str], cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trnfrontier", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"trnf {' '.join(args[:2])} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - started


def _sequential(trials: int, steps: int, env: dict[str, str], work: Path, tag: str) -> float:
    started = time.perf_counter()
    for seed in range(1, trials + 1):
        _trnf(["train", "cpu_smoke", *TINY, f"budget.max_steps={steps}", f"runtime.seed={seed}",
               "--out", str(work / f"seq-{tag}-{seed}")], env, work)  # fmt: skip
    return time.perf_counter() - started


def _sweep(trials: int, steps: int, concurrency: int, env: dict[str, str], work: Path, tag: str) -> float:
    spec = {
        "name": f"bench{concurrency}", "recipe": "cpu_smoke", "overrides": [*TINY, f"budget.max_steps={steps}"],
        "seeds": list(range(1, trials + 1)), "concurrency": concurrency, "resources": {"cpu": 1},
    }  # fmt: skip
    path = work / f"sweep-{tag}.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return _trnf(["sweep", str(path), "--out", str(work / f"sweep-{tag}")], env, work)


def _ray_start(env: dict[str, str]) -> float:
    probe = (
        "import os, time, ray; t = time.perf_counter(); "
        "ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, object_store_memory=128*2**20); "
        "ray.shutdown(); print(time.perf_counter() - t)"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def _ratio(a: list[float], b: list[float]) -> dict[str, Any]:
    """b / a with its 95% interval (log-scale Welch; None with one round)."""
    r = stats.ratio_interval(a, b)
    return {"ratio": r.ratio, "low": r.low, "high": r.high, "method": r.method}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as scratch:
        work = Path(scratch)
        load_prepare(REPO / "prepare.py").setup("sample", home=work / "home")
        env = {**os.environ, "TRNF_HOME": str(work / "home"), "TRNF_DATASET": "sample", "TRNF_COMPILE": "0",
               "TRNF_PREPARE": str(REPO / "prepare.py"), "TRNF_LEDGER": str(work / "ledger.sqlite")}  # fmt: skip
        times: dict[str, list[float]] = {"sequential": [], "sweep_1": [], "sweep_k": [], "ray_start": []}
        for round_ in range(args.rounds):
            tag = str(round_)
            times["sequential"].append(_sequential(args.trials, args.steps, env, work, tag))
            times["sweep_1"].append(_sweep(args.trials, args.steps, 1, env, work, f"1-{tag}"))
            times["sweep_k"].append(_sweep(args.trials, args.steps, args.concurrency, env, work, f"k-{tag}"))
            times["ray_start"].append(_ray_start(env))
            print(json.dumps({"round": round_, **{k: v[-1] for k, v in times.items()}}), file=sys.stderr)
    overhead = [(s1 - seq) / args.trials for s1, seq in zip(times["sweep_1"], times["sequential"], strict=True)]
    document = {
        "benchmark": "bench_sweep",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]},
        "trials": args.trials, "concurrency": args.concurrency, "rounds": args.rounds, "steps_per_trial": args.steps,
        "seconds": times,
        "speedup_sequential_over_sweep_k": _ratio(times["sweep_k"], times["sequential"]),
        "sweep_1_over_sequential": _ratio(times["sequential"], times["sweep_1"]),
        "ray_overhead_per_trial_seconds": {"median": statistics.median(overhead), "rounds": overhead},
        "ray_start_seconds_median": statistics.median(times["ray_start"]),
    }  # fmt: skip
    text = json.dumps(document, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
