"""How faithful `trnf profile`'s phase split is: the phase-split step against a plain step.

    python benchmarks/bench_profile_phases.py [--steps 20] [--warmup 3] [--threads 1]

The profiler times each step twice: once plain, once with a device sync around each
phase (data, forward, backward, optimizer, communication, idle). The syncs cost something;
this prints one JSON document with ``ratio = phase-split step / plain step`` (fastest of
each), for a two-micro-batch model, so a regression in the split's overhead shows. 1.0 is
a split that costs nothing; on an idle machine it was within 10%. It used to be a unit
test; on a loaded machine it wandered (0.157 off), so it is a benchmark.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from trnfrontier.profiling import measure
    from trnfrontier.recipes.loading import validate_recipe

    torch.set_num_threads(args.threads)
    recipe = validate_recipe(
        {
            "name": "phases",
            "model": {"depth": 2, "n_embd": 64, "head_dim": 16, "vocab_size": 512, "sequence_len": 128},
            "data": {"batch_size": 8, "total_batch_tokens": 2048},
            "runtime": {"device": "cpu", "dtype": "float32", "threads": args.threads},
        },
        "phases",
    )
    result = measure.profile(measure.build(recipe), steps=args.steps, warmup=args.warmup, top=3)
    document = {
        "benchmark": "profile_phases",
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "threads": args.threads},
        "steps": args.steps,
        "phase_sum_seconds": result["phase_sum_seconds"],
        "phases": {name: row["seconds"] for name, row in result["phases"].items()},
        "reference": "plain step (no per-phase syncs), fastest of the same run",
        "ratio": result["phase_sum_over_step"],
    }
    print(json.dumps(document, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
