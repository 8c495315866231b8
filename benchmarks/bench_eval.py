"""`trnf eval` throughput against the same model's plain forward pass, in the same run.

    python benchmarks/bench_eval.py [--home DIR] [--recipe cpu_smoke] [--repeats 3] [--threads N]

Prints one JSON document. The claim it checks: scoring adds nothing to a forward pass
beyond reading the validation rows and weighting each target by its byte length.

| measure | ours | reference |
| --- | --- | --- |
| `evaluate_bpb` (tokens/s) | the trusted evaluate_bpb, as the eval worker calls it | `model(x)` over the same rows under no_grad, nothing else |
| `evaluate_bpb_vs_forward_and_loss` (tokens/s) | the same | `model(x)` + float32 per-token cross-entropy: the least any scorer does |
| `worker` (s) | the worker's whole in-process run: load, causality + batch-independence checks, evaluate_bpb | evaluate_bpb alone |
| `cli` (s) | `trnf eval RUN --json` end to end (fresh interpreter, imports) | the evaluate_bpb seconds that run reported |

The three in-process measures run back to back in each of ``--repeats`` rounds; a ratio
is the median over rounds of neighbours in time (with its min-max spread), the absolute
figures the best round. Ratios are ours / reference for throughput (1.0 = no overhead)
and reference / ours for seconds.
Absolute numbers belong to the machine in the "machine" field.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="TRNF_HOME to prepare the sample corpus into (default: a temporary one)")
    parser.add_argument("--recipe", default="cpu_smoke", help="model shape and eval settings (default cpu_smoke)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a shared machine)")
    args = parser.parse_args()

    home = (args.home or Path(tempfile.mkdtemp(prefix="bench_eval_"))).resolve()
    os.environ["TRNF_HOME"] = str(home)
    os.environ["TRNF_DATASET"] = "sample"
    import torch

    torch.set_num_threads(args.threads)
    from trnfrontier.evaluate.worker import run as worker_run
    from trnfrontier.recipes import load_recipe
    from trnfrontier.runtime.checkpoint import save_final
    from trnfrontier.runtime.model import GPT, GPTConfig
    from trnfrontier.trusted_prepare import load_contract

    contract = load_contract()
    prepare = contract.module
    prepare.setup("sample", home=home)
    tokenizer = prepare.ensure_tokenizer()
    recipe = load_recipe(args.recipe).resolved()
    seq_len, batch_size, tokens = recipe.eval.seq_len, recipe.eval.batch_size, recipe.eval.tokens
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_recipe(recipe.model)).eval()

    scored: dict[str, Any] = {}

    def evaluate() -> None:
        scored.update(prepare.evaluate_bpb(model, tokenizer, batch_size, seq_len=seq_len, device="cpu", max_tokens=tokens))

    # The same rows evaluate_bpb reads (windows of seq_len + 1 every seq_len tokens).
    stream = prepare._validation_stream(tokenizer, "public_val")
    rows = min(max(1, tokens // seq_len), (len(stream) - 1) // seq_len)
    data = torch.stack([torch.as_tensor(stream[r * seq_len : r * seq_len + seq_len].astype("int64")) for r in range(rows)])
    forward_tokens = rows * seq_len

    targets = torch.stack([torch.as_tensor(stream[r * seq_len + 1 : r * seq_len + seq_len + 1].astype("int64")) for r in range(rows)])

    def forward_only() -> None:
        with torch.no_grad():
            for first in range(0, rows, batch_size):
                model(data[first : first + batch_size])

    def forward_and_loss() -> None:
        # The least any scorer must do: logits and their per-token cross-entropy in float32.
        with torch.no_grad():
            for first in range(0, rows, batch_size):
                logits = model(data[first : first + batch_size])
                torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets[first : first + batch_size].flatten(), reduction="none")

    run_dir = home / "bench_run"
    # The SHA256 of prepare.py now (not at start-up): the worker compares against the file as it is.
    save_final(run_dir, model, {"prepare_sha256": load_contract().sha256, "tokenizer_sha256": tokenizer.sha256, "recipe": recipe})
    spec = {"path": str(run_dir), "tokens": tokens, "seq_len": seq_len, "batch_size": batch_size, "device": "cpu", "timeout": 1200, "threads": args.threads}

    # Rounds of (forward, evaluate, worker) back to back: on a shared machine the load
    # drifts between minutes, so each ratio compares neighbours in time.
    times: dict[str, list[float]] = {"forward": [], "forward_loss": [], "evaluate": [], "worker": []}
    for _ in range(args.repeats):
        for key, work in (
            ("forward", forward_only),
            ("forward_loss", forward_and_loss),
            ("evaluate", evaluate),
            ("worker", lambda: worker_run(dict(spec))),
        ):
            started = time.perf_counter()
            work()
            times[key].append(time.perf_counter() - started)
    num_tokens = scored["num_tokens"]
    eval_ratios = [(num_tokens / e) / (forward_tokens / f) for e, f in zip(times["evaluate"], times["forward"], strict=True)]
    floor_ratios = [(num_tokens / e) / (forward_tokens / f) for e, f in zip(times["evaluate"], times["forward_loss"], strict=True)]
    worker_ratios = [e / w for e, w in zip(times["evaluate"], times["worker"], strict=True)]

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    trnf = [sys.executable, "-m", "trnfrontier", "eval", str(run_dir), "--json", "--device", "cpu"]
    cli_times, cli_eval_seconds = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        done = subprocess.run(trnf, capture_output=True, text=True, env=env, check=True)
        cli_times.append(time.perf_counter() - started)
        cli_eval_seconds.append(json.loads(done.stdout)["results"][0]["eval_seconds"])
    best = cli_times.index(min(cli_times))

    eval_tps, forward_tps = num_tokens / min(times["evaluate"]), forward_tokens / min(times["forward"])
    print(
        json.dumps(
            {
                "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(), "threads": args.threads},
                "model": {"recipe": args.recipe, "params": model.num_params(), "seq_len": seq_len, "batch_size": batch_size, "eval_tokens": num_tokens},
                "evaluate_bpb": {
                    "unit": "tokens/s",
                    "ours": round(eval_tps, 1),
                    "reference": round(forward_tps, 1),
                    "reference_is": "the same model's forward over the same rows, no_grad, nothing else",
                    "ratio": round(statistics.median(eval_ratios), 3),
                    "ratio_spread": [round(min(eval_ratios), 3), round(max(eval_ratios), 3)],
                },
                "evaluate_bpb_vs_forward_and_loss": {
                    "unit": "tokens/s",
                    "ours": round(eval_tps, 1),
                    "reference": round(forward_tokens / min(times["forward_loss"]), 1),
                    "reference_is": "forward + float32 per-token cross-entropy over the same rows (the scoring floor)",
                    "ratio": round(statistics.median(floor_ratios), 3),
                    "ratio_spread": [round(min(floor_ratios), 3), round(max(floor_ratios), 3)],
                },
                "worker": {
                    "unit": "s",
                    "ours": round(min(times["worker"]), 3),
                    "reference": round(min(times["evaluate"]), 3),
                    "reference_is": "evaluate_bpb alone (the worker adds load + causality + batch-independence checks)",
                    "ratio": round(statistics.median(worker_ratios), 3),
                    "ratio_spread": [round(min(worker_ratios), 3), round(max(worker_ratios), 3)],
                },
                "cli": {
                    "unit": "s",
                    "ours": round(cli_times[best], 3),
                    "reference": round(cli_eval_seconds[best], 3),
                    "reference_is": "evaluate_bpb seconds inside that `trnf eval` run (the rest: interpreter start, imports, load, checks)",
                    "ratio": round(cli_eval_seconds[best] / cli_times[best], 3),
                },
                "val_bpb": scored["val_bpb"],
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
