"""Time-driven vs step-driven LR schedule: val bpb reached in the same wall-clock budget.

    python benchmarks/bench_schedule.py [--budget 30] [--factors 0.5,1,2] [--home DIR]

Prints one JSON document. Every run is a real `trnf train` child process
(``python -m trnfrontier.runtime.entry``) on the offline sample corpus, with a
cpu_smoke-sized model and the same budget; the final val_bpb is the trusted evaluate_bpb
of each run's final checkpoint.

- ours: ``schedule.mode=time``: warmup/warmdown follow the charged fraction of the budget.
- reference: ``schedule.mode=steps`` with ``total_steps`` a guess of how many steps fit,
  as a team would set it: ``factor`` x the steps the time-driven run actually took
  (1 is a perfect guess, which nobody has before the run; 0.5 and 2 are a guess off by
  2x either way). The budget stops every run, whatever its schedule.

ratio = reference val_bpb / ours (above 1: the time-driven schedule reached a lower bpb).
Absolute numbers depend on the machine ("machine" field) and on other load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

# cpu_smoke's family, shrunk so that a 30 s budget takes many steps even on a busy CPU.
SMALL = [
    "model.depth=2",
    "model.n_embd=64",
    "model.head_dim=32",
    "model.n_kv_head=1",
    "model.sequence_len=64",
    "data.batch_size=8",
    "runtime.device=cpu",
    "runtime.dtype=float32",
    "run.checkpoint_every_seconds=null",
    "run.log_every_steps=10",
    "eval.tokens=32768",
    "eval.seq_len=64",
    "eval.batch_size=16",
    "budget.checkpoint_reserve_seconds=1",
]


def recipe_dict(overrides: list[str]) -> dict[str, Any]:
    from trnfrontier.recipes.loading import load_recipe

    return load_recipe("cpu_smoke", [*SMALL, *overrides]).model_dump(mode="json")


def train_once(
    work: Path, name: str, recipe: dict[str, Any], env: dict[str, str]
) -> dict[str, Any]:
    run = work / name
    run.mkdir(parents=True)
    (run / "recipe.json").write_text(json.dumps(recipe))
    cmd = [
        sys.executable,
        "-m",
        "trnfrontier.runtime.entry",
        "--recipe",
        str(run / "recipe.json"),
        "--out",
        str(run),
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"{name}: training failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return json.loads((run / "summary.json").read_text())


def ensure_dataset(home: Path | None) -> Path:
    """A TRNF_HOME with a prepared dataset: the given one, else the sample corpus in a temp dir."""
    from trnfrontier.runtime.prepare_loader import load_prepare

    prepare = load_prepare(REPO_ROOT / "prepare.py")
    if home is not None:
        return home
    home = Path(tempfile.mkdtemp(prefix="trnf_bench_home_"))
    prepare.setup("sample", home=home)
    return home


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--budget", type=float, default=30.0, help="training budget of every run, seconds"
    )
    parser.add_argument(
        "--factors",
        default="0.5,1,2",
        help="total_steps guesses, as multiples of the time run's steps",
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per run")
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="TRNF_HOME with a prepared dataset (default: build the sample)",
    )
    args = parser.parse_args(argv)

    home = ensure_dataset(args.home)
    env = {**os.environ, "TRNF_HOME": str(home), "TRNF_PREPARE": str(REPO_ROOT / "prepare.py")}
    if args.home is None:
        env["TRNF_DATASET"] = "sample"
    common = [f"budget.seconds={args.budget}", f"runtime.threads={args.threads}"]
    results = []
    with tempfile.TemporaryDirectory(prefix="trnf_bench_schedule_") as tmp:
        work = Path(tmp)
        ours = train_once(work, "time", recipe_dict([*common, "schedule.mode=time"]), env)
        results.append(
            {
                "schedule": "time",
                "total_steps": None,
                "steps": ours["steps"],
                "val_bpb": ours["val_bpb"],
                "charged_seconds": round(ours["charged_seconds"], 2),
                "stop_reason": ours["stop_reason"],
            }
        )
        for factor in (float(f) for f in args.factors.split(",")):
            total = max(1, round(factor * ours["steps"]))
            ref = train_once(
                work,
                f"steps_x{factor:g}",
                recipe_dict([*common, "schedule.mode=steps", f"schedule.total_steps={total}"]),
                env,
            )
            results.append(
                {
                    "schedule": f"steps (total_steps = {factor:g} x time run's steps)",
                    "total_steps": total,
                    "steps": ref["steps"],
                    "val_bpb": ref["val_bpb"],
                    "charged_seconds": round(ref["charged_seconds"], 2),
                    "stop_reason": ref["stop_reason"],
                    "ratio": round(ref["val_bpb"] / ours["val_bpb"], 4),
                }
            )
    import torch

    document = {
        "benchmark": "schedule",
        "metric": "final val_bpb (trusted evaluate_bpb, sample corpus public_val), lower is better",
        "ours": "schedule.mode=time",
        "reference_is": "schedule.mode=steps with total_steps guessed as factor x the steps the time run took",
        "ratio_is": "reference val_bpb / ours (above 1: time-driven is better)",
        "budget_seconds": args.budget,
        "results": results,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "threads_per_run": args.threads,
        },
    }
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
