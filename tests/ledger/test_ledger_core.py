"""CORE in the ledger: recorded beside val_bpb by `trnf eval --core`, listed by `trnf runs`,
compared by `trnf compare --metric core` (higher is better) with the same statistics."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from tests.ledger.fake_runs import TOKENIZER, make_run
from trnfrontier.ledger.record import record_eval

BUNDLE = "c" * 64


def score_core(run: Path, core: float, bundle: str = BUNDLE, max_per_task: int | None = None) -> None:
    """What `trnf eval RUN --core` hands the ledger for one run."""
    result = {
        "path": str(run), "status": "ok", "val_bpb": 2.0, "tokens_requested": 131072, "num_tokens": 131072, "seq_len": 256,
        "prepare_sha256": "a" * 64, "tokenizer_sha256": TOKENIZER,
        "core": {"core_metric": core, "bundle_sha256": bundle, "max_per_task": max_per_task, "crop": 256, "tasks": {}},
    }  # fmt: skip
    record_eval({"split": "public_val", "results": [result]}, warn=lambda line: pytest.fail(line))


def sides(root: Path, rng: random.Random, means: tuple[float, float], n: int = 5) -> None:
    for label, mean, overrides in (("base", means[0], None), ("lr03", means[1], ["optim.matrix_lr=0.03"])):
        for i in range(n):
            run = make_run(root, f"{label}-s{i}", 2.0, seed=1337 + i, overrides=overrides, created=float(i))
            score_core(run, mean + rng.gauss(0, 0.002))


def test_core_is_recorded_beside_val_bpb_and_listed(ledger_env: Path, capsys) -> None:
    run = make_run(ledger_env, "r", 2.1)
    score_core(run, 0.1234)
    line = json.loads((run / "scores.jsonl").read_text().splitlines()[-1])
    assert (line["val_bpb"], line["core"], line["core_bundle_sha256"], line["core_crop"]) == (2.0, 0.1234, BUNDLE, 256)
    make_run(ledger_env, "q", 2.2)
    assert run_cli(["runs", "rebuild", str(ledger_env)], capsys)[0] == 0
    code, out, err = run_cli(["runs", "--json", "--sort", "-core"], capsys)
    assert code == 0, err
    listed = json.loads(out)["runs"]
    assert [(r["name"], r["core"]) for r in listed] == [("r", 0.1234), ("q", None)]
    code, out, _ = run_cli(["runs", "show", str(run)], capsys)
    assert code == 0 and "CORE 0.1234 (bundle cccccccccccc, every item, crop 256)" in out


def test_compare_on_core_finds_the_higher_side_better(ledger_env: Path, capsys) -> None:
    sides(ledger_env, random.Random(2), (0.10, 0.13))
    code, out, err = run_cli(["compare", "base-s0", "lr03-s0", "--metric", "core", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["metric"] == "core" and doc["higher_is_better"]
    assert doc["verdict"] == "B better" and doc["difference"]["difference"] > 0.02
    assert doc["difference"]["method"] == "paired" and doc["a"]["runs"][0]["core"] == pytest.approx(0.10, abs=0.01)
    assert not doc["projection"]["available"] and doc["caveat"] is None
    code, out, _ = run_cli(["compare", "lr03-s0", "base-s0", "--metric", "core"], capsys)
    assert code == 0 and "A better by" in out and "CORE, bundle cccccccccccc, every item, crop 256 (higher is better)" in out


def test_core_scores_on_different_bundles_or_subsamples_are_refused(ledger_env: Path, capsys) -> None:
    a = make_run(ledger_env, "a", 2.0)
    b = make_run(ledger_env, "b", 2.0, overrides=["optim.matrix_lr=0.03"])
    score_core(a, 0.1)
    score_core(b, 0.2, max_per_task=100)
    code, _, err = run_cli(["compare", "a", "b", "--metric", "core"], capsys)
    assert code == 1 and "different CORE items per task (--max-per-task)" in err and "--core --bundle" in err
    code, _, err = run_cli(["compare", "a", "b", "--metric", "core", "--tokens", "5"], capsys)
    assert code == 2 and "--tokens and --seq-len select val_bpb scores" in err
    make_run(ledger_env, "c", 2.0, overrides=["optim.matrix_lr=0.05"])
    assert run_cli(["runs", "rebuild", str(ledger_env)], capsys)[0] == 0
    code, _, err = run_cli(["compare", "a", "c", "--metric", "core"], capsys)
    assert code == 1 and "has no core scores" in err and "trnf eval --core" in err
