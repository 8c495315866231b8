"""What the integrity checks cost: SHA256 manifests of checkpoints and token files.

    .venv/bin/python benchmarks/bench_integrity.py [--recipe baseline_d10] [--repeats 2] [--home DIR]

Prints one JSON document. ``checkpoint``: a resumable checkpoint of the recipe's model
(weights + optimizer state) saved with its manifest (ours) beside the same save without
it (reference), and the check a resume runs on it; ``ratio = ours / reference`` seconds
(above 1: the manifest's extra time). ``token_files``: ``prepare.verify_token_files`` over
the prepared dataset (the `sample` corpus in a temporary home unless ``--home``), as
`trnf train` runs it before training, in MB/s. Best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from trnfrontier.recipes.loading import load_recipe
from trnfrontier.runtime import checkpoint as ck
from trnfrontier.runtime.integrity import check_directory
from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.optim import build_optimizers
from trnfrontier.runtime.prepare_loader import load_prepare

REPO = Path(__file__).resolve().parents[1]


def _model(recipe: str) -> tuple[GPT, list[torch.optim.Optimizer]]:
    resolved = load_recipe(recipe).resolved()
    model = GPT(GPTConfig.from_recipe(resolved.model))
    optimizers = build_optimizers(model, resolved.optim)
    tokens = torch.randint(0, model.config.vocab_size, (1, 64))
    model.loss(tokens, tokens).backward()
    for optimizer in optimizers:  # so the optimizer state (momenta) exists and is saved
        optimizer.step()
    return model, optimizers


def _save(root: Path, model: GPT, optimizers: list[torch.optim.Optimizer], manifest: bool) -> float:
    plain, tensors = ck.capture_rng(torch.device("cpu"))
    real = ck.write_manifest
    if not manifest:
        ck.write_manifest = lambda directory: None  # type: ignore[assignment]
    try:
        started = time.perf_counter()
        ck.save_checkpoint(root, step=1, model=model, optimizers=optimizers, meta={},
                           rank_states=[{"rng": plain}], rank_rng=[tensors], keep_last=1)
        return time.perf_counter() - started
    finally:
        ck.write_manifest = real  # type: ignore[assignment]


def bench_checkpoint(recipe: str, repeats: int) -> dict[str, object]:
    model, optimizers = _model(recipe)
    ours, reference, check = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            reference.append(_save(Path(tmp) / "plain", model, optimizers, manifest=False))
            ours.append(_save(Path(tmp) / "manifest", model, optimizers, manifest=True))
            latest = ck.list_checkpoints(Path(tmp) / "manifest")[-1]
            started = time.perf_counter()
            check_directory(latest)
            check.append(time.perf_counter() - started)
        size = sum(p.stat().st_size for p in latest.iterdir())
    return {"recipe": recipe, "params": model.num_params(), "bytes": size, "save_with_manifest_s": min(ours),
            "save_without_s": min(reference), "ratio": min(ours) / min(reference), "check_on_resume_s": min(check)}


def bench_token_files(home: str | None, repeats: int) -> dict[str, object]:
    prepare = load_prepare(REPO / "prepare.py")
    with tempfile.TemporaryDirectory() as tmp:
        root = home or tmp
        if home is None:
            prepare.setup("sample", home=root)
        os.environ["TRNF_HOME"] = root
        runs = [prepare.verify_token_files(None, root) for _ in range(repeats)]
    best = min(runs, key=lambda r: r["seconds"])
    return {**best, "mb_per_s": best["bytes"] / 1e6 / max(best["seconds"], 1e-9)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="baseline_d10")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--home", default=None, help="a TRNF_HOME with a prepared dataset (default: sample, temporary)")
    args = parser.parse_args()
    print(json.dumps({
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "checkpoint": bench_checkpoint(args.recipe, args.repeats),
        "token_files": bench_token_files(args.home, args.repeats),
    }, indent=2))


if __name__ == "__main__":
    main()
