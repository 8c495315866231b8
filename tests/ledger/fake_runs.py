"""Run directories with planted scores, written the way the trainer and the tool write them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trnfrontier.recipes.loading import load_recipe

PREPARE = "a" * 64
TOKENIZER = "b" * 64


def make_run(
    root: Path,
    name: str,
    val_bpb: float | None,
    *,
    seed: int = 1337,
    overrides: list[str] | None = None,
    tokens: int = 131072,
    seq_len: int = 256,
    prepare: str = PREPARE,
    tokens_per_second: float = 1000.0,
    status: str = "completed",
    created: float = 0.0,
    parent: Path | None = None,
    losses: list[float] | None = None,
    steps: int = 100,
    speed_env: dict[str, Any] | None = None,
    sweep: dict[str, Any] | None = None,
) -> Path:
    """A completed cpu_smoke run (with ``overrides``) whose trainer recorded ``val_bpb``."""
    run = root / name
    run.mkdir(parents=True)
    recipe = load_recipe("cpu_smoke", [f"runtime.seed={seed}", *(overrides or [])]).model_dump(mode="json")
    (run / "recipe.json").write_text(json.dumps(recipe))
    summary: dict[str, Any] = {
        "name": "cpu_smoke", "status": status, "val_bpb": val_bpb, "eval_tokens": tokens,
        "eval_num_tokens": tokens, "eval_seq_len": seq_len, "steps": steps, "tokens": steps * 4096,
        "tokens_per_second": tokens_per_second, "charged_seconds": 110.0, "device": "cpu",
        "world_size": 1, "prepare_sha256": prepare, "tokenizer_sha256": TOKENIZER, "params": 1000,
    }  # fmt: skip
    if speed_env is not None:
        summary["speed_env"] = speed_env
    (run / "summary.json").write_text(json.dumps(summary))
    provenance = {
        "recipe_ref": "cpu_smoke", "overrides": [f"runtime.seed={seed}", *(overrides or [])],
        "git": {"repo": None, "commit": "c0ffee" + "0" * 34, "dirty": False},
        "env": {"NEURON_CC_FLAGS": "--model-type transformer"}, "dataset": "sample",
        "data_id": "sample:0123456789abcdef", "parent": str(parent.resolve()) if parent else None,
        "created": created, "sweep": sweep,
    }  # fmt: skip
    (run / "provenance.json").write_text(json.dumps(provenance))
    if losses is not None:
        lines = [json.dumps({"step": i, "tokens": 4096 * (i + 1), "loss": loss}) for i, loss in enumerate(losses)]
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run
