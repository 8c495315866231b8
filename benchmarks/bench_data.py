"""Data-path benchmarks for prepare.py, each beside a reference measured in the same run.

    python benchmarks/bench_data.py [--home DIR] [--repeats N]

Prints one JSON document. Every figure comes with its reference and the ratio
(ours / reference for throughput: above 1 is faster). Absolute numbers depend on the
machine, which is described in the "machine" field.

| measure              | ours                                        | reference                                   |
| -------------------- | ------------------------------------------- | ------------------------------------------- |
| tokenizer training   | prepare.train_tokenizer (rustbpe + pickle)  | bare rustbpe train_from_iterator            |
| encoding             | prepare's shard tokenizer (threads, BOS, uint16 file) | tiktoken encode_ordinary_batch   |
| data loader          | make_dataloader (best-fit packing)          | consecutive memmap windows, no packing      |
| evaluation           | evaluate_bpb on a small model               | the same model's forward over the same rows |
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def best_of(repeats: int, work: Callable[[], Any]) -> float:
    """The fastest of ``repeats`` runs (seconds): the least disturbed by other load."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def entry(unit: str, ours: float, reference: float, reference_name: str) -> dict[str, Any]:
    return {"unit": unit, "ours": round(ours, 3), "reference": round(reference, 3),
            "reference_is": reference_name, "ratio": round(ours / reference, 3) if reference else None}


def bench_tokenizer(prepare: Any, texts: list[str], repeats: int) -> dict[str, Any]:
    import rustbpe

    megabytes = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    ours = best_of(repeats, lambda: prepare.train_tokenizer(texts))

    def bare() -> None:
        trainer = rustbpe.Tokenizer()
        trainer.train_from_iterator(iter(texts), prepare.TOKENIZER_VOCAB_SIZE - len(prepare.SPECIAL_TOKENS),
                                    pattern=prepare.SPLIT_PATTERN)

    return entry("MB/s", megabytes / ours, megabytes / best_of(repeats, bare), "bare rustbpe train_from_iterator")


def bench_encoding(prepare: Any, tokenizer: Any, shard: Path, texts: list[str], repeats: int) -> dict[str, Any]:
    megabytes = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    out = Path(tempfile.mkdtemp()) / "bench.bin"
    ours = best_of(repeats, lambda: prepare._tokenize_shard(tokenizer, shard, out, lambda n: None))
    threads = os.cpu_count() or 1
    reference = best_of(repeats, lambda: tokenizer.enc.encode_ordinary_batch(texts, num_threads=threads))
    result = entry("MB/s", megabytes / ours, megabytes / reference,
                   f"tiktoken encode_ordinary_batch (num_threads={threads}), no file written")
    result["single_thread_MB_per_s"] = round(megabytes / best_of(repeats, lambda: [tokenizer.enc.encode_ordinary(t) for t in texts]), 3)
    return result


def bench_loader(prepare: Any, tokenizer: Any, batch: int, seq: int, batches: int, repeats: int) -> dict[str, Any]:
    import numpy as np
    import torch

    def ours() -> None:
        loader = prepare.make_dataloader(tokenizer, batch, seq, "train")
        for _ in range(batches):
            next(loader)

    arrays = prepare._token_arrays("train", tokenizer)
    stream = arrays[0]

    def windows() -> None:
        row = seq + 1
        for i in range(batches):
            start = (i * batch * row) % (len(stream) - batch * row)
            rows = torch.from_numpy(np.asarray(stream[start:start + batch * row], dtype=np.int64).reshape(batch, row))
            rows[:, :-1], rows[:, 1:]

    tokens = batch * seq * batches
    return entry("tokens/s", tokens / best_of(repeats, ours), tokens / best_of(repeats, windows),
                 "consecutive memmap windows (no packing, no document alignment)")


def bench_eval(prepare: Any, tokenizer: Any, batch: int, seq: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    import numpy as np
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(prepare.TOKENIZER_VOCAB_SIZE, 64), nn.Linear(64, prepare.TOKENIZER_VOCAB_SIZE))
    result: dict[str, Any] = {}

    def ours() -> None:
        result.update(prepare.evaluate_bpb(model, tokenizer, batch, seq_len=seq, max_tokens=max_tokens))

    stream = np.asarray(prepare._validation_stream(tokenizer, "public_val"), dtype=np.int64)
    rows = min(max_tokens // seq, (len(stream) - 1) // seq)
    data = torch.from_numpy(np.stack([stream[r * seq:r * seq + seq + 1] for r in range(rows)]))

    def forward_only() -> None:
        with torch.no_grad():
            for first in range(0, rows, batch):
                model(data[first:first + batch, :-1])

    ours_s = best_of(repeats, ours)
    tokens = rows * seq
    out = entry("tokens/s", tokens / ours_s, tokens / best_of(repeats, forward_only),
                "the same model's forward over the same rows (no loss, no bookkeeping)")
    out["model"] = "Embedding(8192, 64) -> Linear(64, 8192)"
    out["val_bpb"] = round(result["val_bpb"], 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=None, help="a TRNF_HOME to reuse (default: a fresh temporary one)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    sys.path.insert(0, str(REPO_ROOT))
    import pyarrow.parquet as pq
    import torch

    import prepare

    home = args.home or Path(tempfile.mkdtemp(prefix="trnf-bench-"))
    os.environ["TRNF_HOME"] = str(home)
    os.environ["TRNF_DATASET"] = "sample"
    started = time.perf_counter()
    summary = prepare.setup("sample", home=home)
    setup_seconds = time.perf_counter() - started
    tokenizer = prepare.ensure_tokenizer()
    shard = home / "datasets" / "sample" / "shards" / "train_00000.parquet"
    texts = pq.read_table(shard).column("text").to_pylist()

    report = {
        "benchmark": "bench_data",
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        "corpus": {"source": "sample", "train_megabytes": round(sum(len(t.encode()) for t in texts) / 1e6, 3),
                   "setup_seconds": round(setup_seconds, 2), "reused": summary["reused"]},
        "tokenizer_training": bench_tokenizer(prepare, texts, args.repeats),
        "encoding": bench_encoding(prepare, tokenizer, shard, texts, args.repeats),
        "dataloader": bench_loader(prepare, tokenizer, batch=8, seq=1024, batches=40, repeats=args.repeats),
        "evaluate_bpb": bench_eval(prepare, tokenizer, batch=8, seq=256, max_tokens=32768, repeats=args.repeats),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
