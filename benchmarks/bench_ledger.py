"""How long the run ledger takes to rebuild from run directories and to load.

    .venv/bin/python benchmarks/bench_ledger.py [--runs 500] [--repeats 3]

Writes ``--runs`` synthetic run directories (recipe.json, summary.json, provenance.json, one
eval score each) into a temporary folder, then times, best of ``--repeats``:

- ``rebuild``: ``trnf runs rebuild`` (find, read every run directory, write a fresh SQLite
  file and swap it in), against the reference ``read``: finding and reading the same run
  directories with nothing written. ``ratio = rebuild / read`` (time; the cost of the index
  on top of reading the files).
- ``load``: every run with its scores out of the ledger (what each `trnf runs` and
  `trnf compare` starts with), against the same reference.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trnfrontier.ledger import reader, record, store
from trnfrontier.recipes.loading import load_recipe


def write_runs(root: Path, count: int) -> None:
    recipe = load_recipe("cpu_smoke").model_dump(mode="json")
    rng = random.Random(0)
    for i in range(count):
        run = root / f"run{i:05d}"
        run.mkdir(parents=True)
        recipe["runtime"]["seed"] = i
        recipe["optim"]["matrix_lr"] = 0.01 + 0.001 * (i % 10)
        (run / "recipe.json").write_text(json.dumps(recipe))
        summary = {"status": "completed", "val_bpb": 0.95 + rng.gauss(0, 0.001), "eval_tokens": 131072,
                   "eval_seq_len": 256, "steps": 100, "tokens": 409600, "tokens_per_second": 1000.0,
                   "charged_seconds": 110.0, "device": "cpu", "world_size": 1}  # fmt: skip
        (run / "summary.json").write_text(json.dumps(summary))
        (run / "provenance.json").write_text(json.dumps({"recipe_ref": "cpu_smoke", "created": float(i)}))
        score = {"source": "eval", "val_bpb": summary["val_bpb"], "num_tokens": 2048, "seq_len": 256, "status": "ok"}
        (run / "scores.jsonl").write_text(json.dumps(score) + "\n")


def best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trnf-bench-ledger-") as scratch:
        root = Path(scratch) / "runs"
        write_runs(root, args.runs)
        os.environ[store.LEDGER_ENV] = str(Path(scratch) / "ledger.sqlite")

        def read() -> None:
            for run_dir in reader.find_run_dirs([root]):
                reader.read_run(run_dir)

        def load() -> None:
            with store.open_ledger() as ledger:
                ledger.runs()

        read_s = best(read, args.repeats)
        rebuild_s = best(lambda: record.rebuild([root]), args.repeats)
        load_s = best(load, args.repeats)
    document = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_implementation()} {platform.python_version()}",
        "runs": args.runs,
        "reference": {"read_seconds": read_s},
        "rebuild": {"seconds": rebuild_s, "ratio": rebuild_s / read_s},
        "load": {"seconds": load_s, "ratio": load_s / read_s},
    }
    print(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
