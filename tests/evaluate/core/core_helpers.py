"""Helpers of the CORE tests: a seeded GPT and a bundle folder written from data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def random_gpt(seed: int = 0, width: int = 64, depth: int = 2) -> torch.nn.Module:
    """A seeded GPT whose blocks are not the identity (trained-like, not zero projections)."""
    from trnfrontier.runtime.model import GPT, GPTConfig

    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=8192, sequence_len=128, n_layer=depth, n_head=2, n_kv_head=1, n_embd=width))
    with torch.no_grad():
        for block in model.blocks:
            torch.nn.init.normal_(block.attn.c_proj.weight, std=0.05)
            torch.nn.init.normal_(block.mlp.c_proj.weight, std=0.05)
        torch.nn.init.normal_(model.lm_head.weight, std=0.1)
    return model.eval()


def write_bundle(root: Path, tasks: list[dict[str, Any]], baselines: dict[str, float], files: dict[str, str]) -> Path:
    """A bundle folder: core.yaml from ``tasks`` (written as YAML), the CSV, task files."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    (root / "core.yaml").write_text(yaml.safe_dump({"icl_tasks": tasks}), encoding="utf-8")
    rows = "".join(f"{label},{value}\n" for label, value in baselines.items())
    (root / "eval_meta_data.csv").write_text("Eval Task,Random baseline\n" + rows, encoding="utf-8")
    for name, text in files.items():
        path = root / "eval_data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def rank_worker(rank: int, world: int, store: str, jobs: list[tuple[str, str]], out_dir: str) -> None:
    """One of ``world`` gloo ranks: CORE on each (bundle folder, name) in ``jobs``; the
    report (or the error) as JSON in ``out_dir/<name>-<rank>.json``."""
    import json
    import os

    import torch.distributed as dist

    from trnfrontier.errors import TrnfError
    from trnfrontier.evaluate.core import fetch
    from trnfrontier.evaluate.core.run import CoreOptions, evaluate_core
    from trnfrontier.runtime.prepare_loader import load_prepare

    repo = Path(__file__).resolve().parents[3]
    prepare = load_prepare(repo / "prepare.py")
    tokenizer = prepare.Tokenizer.from_pickle_bytes(prepare.read_tokenizer_artifact()[0])
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        model = elementwise_model()
        for folder, name in jobs:
            try:
                result: Any = evaluate_core(fetch.resolve(folder), model, tokenizer, torch.device("cpu"), CoreOptions())
            except TrnfError as exc:
                result = {"error": str(exc)}
            with open(os.path.join(out_dir, f"{name}-{rank}.json"), "w", encoding="utf-8") as handle:
                json.dump(result, handle)
    finally:
        dist.destroy_process_group()


def elementwise_model(vocab: int = 8192, seed: int = 5) -> torch.nn.Module:
    """Logits [B, T, vocab] = a[x] * b + c: a row's logits are the same in any batch."""

    class Elementwise(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            generator = torch.Generator().manual_seed(seed)
            self.a = torch.nn.Parameter(torch.randn(vocab, generator=generator))
            self.b = torch.nn.Parameter(torch.randn(vocab, generator=generator))
            self.c = torch.nn.Parameter(torch.randn(vocab, generator=generator))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a[x].unsqueeze(-1) * self.b + self.c

    return Elementwise().eval()


def resolve_worker(home: str, spec: str, pin: str, out: str) -> None:
    """A separate process resolving ``spec`` in data home ``home``; the folder it got in ``out``."""
    import os

    os.environ["TRNF_HOME"] = home
    from trnfrontier.evaluate.core import fetch

    Path(out).write_text(str(fetch.resolve(spec, pin).bundle.root), encoding="utf-8")


def wait_for_lock_waiters(lock: Path, pids: list[int], processes: list[Any], deadline_s: float = 300.0) -> None:
    """Return once every pid is blocked on ``lock`` (a ``->`` line of /proc/locks names it);
    fail if one exits first, or at the deadline (a hang guard, not a speed assertion)."""
    import time

    inode = f":{lock.stat().st_ino} "
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        lines = Path("/proc/locks").read_text().splitlines()
        waiting = {int(line.split()[5]) for line in lines if "->" in line and inode in line + " "}
        if set(pids) <= waiting:
            return
        if any(p.exitcode is not None for p in processes):
            raise AssertionError(f"a process finished without waiting for {lock}: the lock was not taken")
        time.sleep(0.05)
    raise AssertionError(f"processes {pids} never waited on {lock}")
