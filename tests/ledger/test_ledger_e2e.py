"""The ledger end to end with real tiny runs: `trnf compare --seeds` trains them, `trnf eval`
adds a score, `trnf runs` shows all of it (about a minute on 2 cores)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_run import run_cli

REPO = Path(__file__).resolve().parents[2]
# Three steps of a one-layer model at context 32; the final score on 2,048 tokens.
TINY = (
    "cpu_smoke model.depth=1 model.n_embd=64 model.head_dim=32 model.n_kv_head=1 model.sequence_len=32 "
    "data.batch_size=4 runtime.threads=1 eval.tokens=2048 eval.seq_len=32 eval.batch_size=8 "
    "budget.startup_steps_excluded=1 budget.max_steps=3 run.checkpoint_every_seconds=null"
)


@pytest.mark.slow
def test_compare_trains_missing_seeds_and_the_ledger_records_everything(
    sample_home: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("TRNF_PREPARE", str(REPO / "prepare.py"))
    monkeypatch.setenv("TRNF_LEDGER", str(tmp_path / "ledger.sqlite"))
    monkeypatch.setenv("NEURON_CC_FLAGS", "--optlevel 1")
    monkeypatch.chdir(tmp_path)
    a, b = TINY, TINY + " optim.matrix_lr=0.05"

    code, out, err = run_cli(["compare", a, b, "--seeds", "2", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["a"]["n"] == 2 and doc["b"]["n"] == 2
    assert [r["seed"] for r in doc["a"]["runs"]] == [1337, 1338] == [r["seed"] for r in doc["b"]["runs"]]
    assert doc["setting"]["num_tokens"] == 2048 and doc["setting"]["seq_len"] == 32
    assert doc["verdict"] in ("A better", "B better", "no significant difference")
    assert doc["difference"]["low"] <= doc["difference"]["difference"] <= doc["difference"]["high"]

    # Enough seeds now: nothing more is trained, the same answer comes back.
    code, out, err = run_cli(["compare", a, b, "--seeds", "2", "--json"], capsys)
    assert code == 0 and "training" not in err
    assert json.loads(out)["difference"] == doc["difference"]

    code, out, _ = run_cli(["runs", "--json"], capsys)
    runs = json.loads(out)["runs"]
    assert len(runs) == 4 and {r["status"] for r in runs} == {"completed"}
    first = runs[0]
    assert first["git_commit"] and len(first["git_commit"]) == 40  # the shipped recipe lives in this repository
    assert first["env"]["NEURON_CC_FLAGS"] == "--optlevel 1"
    assert first["dataset"] == "sample" and first["data_id"].startswith("sample:")
    assert first["prepare_sha256"] and first["tokenizer_sha256"] and first["tokens_per_second"] > 0
    assert "runtime.seed=1337" in first["overrides"]

    # A later `trnf eval` of a run adds a score to it.
    code, _, err = run_cli(
        ["eval", first["run_dir"], "--tokens", "1024", "--seq-len", "32", "--batch-size", "8", "--device", "cpu"], capsys
    )
    assert code == 0, err
    code, out, _ = run_cli(["runs", "show", first["name"], "--json"], capsys)
    shown = json.loads(out)
    assert [s["source"] for s in shown["scores"]] == ["train", "eval"]
    assert shown["scores"][1]["num_tokens"] == 1024 and shown["scores"][1]["data_id"] == first["data_id"]

    # Lost ledger: rebuilt from the run directories, the eval score included.
    Path("ledger.sqlite").unlink()
    code, out, err = run_cli(["runs", "--json"], capsys)
    assert code == 0 and "rebuilt it from 4 run directories" in err
    again = {r["name"]: r for r in json.loads(out)["runs"]}
    assert len(again[first["name"]]["scores"]) == 2
