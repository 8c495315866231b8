"""`trnf runs` and `trnf compare` on synthetic run directories with known answers."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from tests.ledger.fake_runs import make_run
from trnfrontier.ledger import official, reader

BETTER = "optim.matrix_lr=0.03"


def seeds(root: Path, prefix: str, mean: float, n: int, rng: random.Random, overrides: list[str] | None = None) -> None:
    for i in range(n):
        make_run(root, f"{prefix}-s{i}", mean + rng.gauss(0, 0.0003), seed=1337 + i, overrides=overrides, created=float(i))


def one_error(err: str) -> str:
    """The error line: exactly one, and the last thing on stderr (notes may come before)."""
    lines = err.strip().splitlines()
    assert sum(line.startswith("trnf: error:") for line in lines) == 1 and lines[-1].startswith("trnf: error:"), err
    return lines[-1]


def compare_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    code, out, err = run_cli(["compare", *args, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)


def test_a_planted_difference_is_found(ledger_env: Path, capsys) -> None:
    rng = random.Random(1)
    seeds(ledger_env, "base", 0.950, 5, rng)
    seeds(ledger_env, "lr03", 0.946, 5, rng, [BETTER])
    doc = compare_json(capsys, "base-s0", "lr03-s0")  # one run names all its seeds
    assert doc["a"]["n"] == 5 and doc["b"]["n"] == 5
    assert doc["difference"]["method"] == "paired"  # both sides ran seeds 1337..1341
    assert doc["verdict"] == "B better"
    d = doc["difference"]
    assert d["low"] < -0.004 + 0.0008 and d["high"] < 0 and d["p_value"] < 0.001
    assert doc["message"].startswith("B better by 0.00") and "p < 0.001" in doc["message"]
    assert "131,072 local evaluation tokens" in doc["caveat"]
    # The same through the human table, and with the sides named as recipes.
    code, out, _ = run_cli(["compare", "cpu_smoke", f"cpu_smoke {BETTER}"], capsys)
    assert code == 0 and "B better by" in out and "no official scores recorded" in out


def test_an_equal_pair_is_no_significant_difference(ledger_env: Path, capsys) -> None:
    # Same seeds; B is A moved by +-0.0002 in turn: the mean difference is exactly zero.
    rng = random.Random(2)
    base = [0.950 + rng.gauss(0, 0.0003) for _ in range(4)]
    for i, value in enumerate(base):
        make_run(ledger_env, f"base-s{i}", value, seed=1337 + i, created=float(i))
        make_run(ledger_env, f"same-s{i}", value + 0.0002 * (-1) ** i, seed=1337 + i, overrides=["run.log_every_steps=2"])
    doc = compare_json(capsys, "base-*", "same-*")
    assert doc["difference"]["method"] == "paired" and doc["difference"]["p_value"] > 0.99
    assert doc["verdict"] == "no significant difference"
    assert doc["difference"]["low"] < 0 < doc["difference"]["high"]
    welch = compare_json(capsys, "base-*", "same-*", "--unpaired")
    assert welch["difference"]["method"] == "welch" and welch["verdict"] == "no significant difference"
    assert "more seeds per side would resolve" in doc["message"] or "below what seeds can resolve" in doc["message"]
    if doc["seeds_to_resolve"] is not None:
        assert doc["seeds_to_resolve"] >= 1
    # A difference of 10 spreads needs no more seeds than the 4 a side has; a tenth of a spread, hundreds.
    assert compare_json(capsys, "base-*", "same-*", "--resolve", "0.003")["seeds_to_resolve"] == 0
    tiny = compare_json(capsys, "base-*", "same-*", "--resolve", "0.00003")
    assert tiny["seeds_to_resolve"] is None and "below what seeds can resolve" in tiny["message"]
    code, _, err = run_cli(["compare", "base-*", "same-*", "--resolve", "0"], capsys)
    assert code == 2 and "--resolve" in one_error(err)


def test_one_run_per_side_says_it_cannot_know(ledger_env: Path, capsys) -> None:
    make_run(ledger_env, "x", 0.95)
    make_run(ledger_env, "y", 0.94, overrides=[BETTER])
    doc = compare_json(capsys, "x", "y")
    assert doc["verdict"] == "unknown" and "--seeds" in doc["message"]


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"seq_len": 512}, "sequence length"), ({"prepare": "f" * 64}, "prepare.py"), ({"tokens": 2048}, "evaluation tokens")],
)
def test_refuses_scores_measured_differently(ledger_env: Path, capsys, changes: dict, field: str) -> None:
    make_run(ledger_env, "a1", 0.95)
    make_run(ledger_env, "a2", 0.951, seed=2)
    make_run(ledger_env, "b1", 0.94, overrides=[BETTER], **changes)
    code, out, err = run_cli(["compare", "a1,a2", "b1"], capsys)
    assert code == 1 and out == ""
    assert "refusing to compare" in one_error(err) and field in one_error(err)


def test_bad_groups_are_one_line(ledger_env: Path, capsys) -> None:
    make_run(ledger_env, "a1", 0.95)
    for args, words in ((["nope-*", "a1"], "matches"), (["a1", "a1"], "share runs"), (["a1", "zz,a1"], "no run 'zz'")):
        code, _, err = run_cli(["compare", *args], capsys)
        assert code in (1, 2) and words in one_error(err), err


def test_runs_lists_filters_sorts_and_rebuilds(ledger_env: Path, capsys) -> None:
    base = make_run(ledger_env, "base", 0.95, created=1.0, tokens_per_second=900.0)
    make_run(ledger_env, "fast", 0.96, overrides=["data.batch_size=32"], created=2.0, parent=base, tokens_per_second=1500.0)
    make_run(ledger_env, "dead", None, status="diverged", created=3.0)
    code, out, err = run_cli(["runs", "--json"], capsys)
    assert code == 0 and "rebuilt it from 3 run directories" in err  # no ledger yet: built from runs/
    runs = json.loads(out)["runs"]
    assert [r["name"] for r in runs] == ["base", "fast", "dead"]
    fast = runs[1]
    assert fast["parent_diff"] == {"data.batch_size": [16, 32]} and fast["parent_name"] == "base"
    assert fast["env"] == {"NEURON_CC_FLAGS": "--model-type transformer"} and fast["git_dirty"] is False
    assert fast["scores"][0]["num_tokens"] == 131072 and fast["scores"][0]["seq_len"] == 256
    code, out, _ = run_cli(["runs", "--json", "--sort", "-tokens_per_second", "--status", "completed"], capsys)
    assert [r["name"] for r in json.loads(out)["runs"]] == ["fast", "base"]
    code, out, _ = run_cli(["runs", "--json", "--sort", "val_bpb"], capsys)
    assert [r["name"] for r in json.loads(out)["runs"]] == ["base", "fast", "dead"]
    code, out, _ = run_cli(["runs"], capsys)
    assert code == 0 and "batch_size 16->32" in out and "diverged" in out
    shutil.rmtree(ledger_env / "dead")
    code, out, _ = run_cli(["runs"], capsys)
    assert "diverged (folder gone)" in out
    code, _, err = run_cli(["runs", "--sort", "nonsense"], capsys)
    assert code == 2 and "no such column" in err
    # A damaged ledger is a clear line that names the fix; rebuild restores it.
    Path("ledger.sqlite").write_bytes(b"not a database at all" * 100)
    code, _, err = run_cli(["runs"], capsys)
    assert code == 1 and "trnf runs rebuild" in err
    code, out, _ = run_cli(["runs", "rebuild", "runs"], capsys)
    assert code == 0 and "2 runs" in out  # the deleted one is gone from the index too


def test_the_projection_recovers_a_planted_offset(ledger_env: Path, capsys) -> None:
    rng = random.Random(4)
    offset = 0.0215
    for i in range(6):
        local = 0.95 + 0.01 * i
        make_run(ledger_env, f"r{i}", local, seed=i, created=float(i))
    code, out, _ = run_cli(["runs"], capsys)
    assert "no official scores recorded" in out
    for i in range(5):  # r5 stays unofficial: its projection is what a team wants
        code, out, err = run_cli(["runs", "record-official", f"r{i}", str(0.95 + 0.01 * i + offset + rng.gauss(0, 0.0004))], capsys)
        assert code == 0, err
    code, out, _ = run_cli(["runs", "--json"], capsys)
    doc = json.loads(out)
    (fit,) = doc["official_fits"]
    assert fit["pairs"] == 5 and abs(fit["offset"] - offset) <= fit["offset_half_width"]
    r5 = next(r for r in doc["runs"] if r["name"] == "r5")
    value, half = r5["projected"]
    assert abs(value - (1.00 + offset)) < half < 0.003
    # One pair: an offset, but no invented uncertainty.
    fits = official.fit_offsets([{"name": "x", "official": [{"official": 1.0, "local_val_bpb": 0.98, "local_num_tokens": 1, "local_seq_len": 2}]}])
    assert fits[(1, 2)].offset == pytest.approx(0.02) and fits[(1, 2)].prediction_half_width is None
    code, _, err = run_cli(["runs", "record-official", "r0", "0"], capsys)
    assert code == 2 and "positive" in err


def test_show_and_plots(ledger_env: Path, capsys) -> None:
    a = make_run(ledger_env, "a", 0.95, losses=[9.0, 6.0, 5.0, 4.5])
    make_run(ledger_env, "b", 0.94, overrides=[BETTER], losses=[9.0, 5.5, 4.6, 4.1], parent=a, tokens_per_second=1200.0)
    code, out, _ = run_cli(["runs", "show", "b", "--json"], capsys)
    shown = json.loads(out)
    assert code == 0 and shown["parent_diff"] == {"optim.matrix_lr": [0.02, 0.03]}
    assert shown["recipe_key"] == reader.recipe_key(json.loads((ledger_env / "b" / "recipe.json").read_text()))
    code, out, _ = run_cli(["runs", "show", str(ledger_env / "a")], capsys)
    assert code == 0 and "score (train): val_bpb 0.950000" in out and "no official scores recorded" in out
    # The parent is the team's to choose.
    assert run_cli(["runs", "set-parent", "b"], capsys)[0] == 0
    assert json.loads(run_cli(["runs", "show", "b", "--json"], capsys)[1])["parent_diff"] is None
    assert run_cli(["runs", "set-parent", "b", "a"], capsys)[0] == 0
    assert json.loads(run_cli(["runs", "show", "b", "--json"], capsys)[1])["parent_name"] == "a"
    code, _, err = run_cli(["runs", "set-parent", "a", "a"], capsys)
    assert code == 2 and "its own parent" in one_error(err)
    # With an official pair, every score at that setting shows its projection.
    assert run_cli(["runs", "record-official", "a", "0.97"], capsys)[0] == 0
    code, out, _ = run_cli(["runs", "show", "b"], capsys)
    assert "projected official 0.9600 (± ?)" in out  # one pair: offset +0.02, uncertainty unknown
    code, out, err = run_cli(["runs", "plot", "a", "b", "-o", "curves.png"], capsys)
    assert code == 0, err
    assert Path("curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, err = run_cli(["runs", "plot", "--speed", "-o", "speed.png"], capsys)
    assert code == 0 and Path("speed.png").stat().st_size > 1000, err
    code, _, err = run_cli(["runs", "plot"], capsys)
    assert code == 2 and "give the runs" in err


def test_only_a_runs_final_model_scores_for_it(tmp_path: Path) -> None:
    run = make_run(tmp_path, "r", 0.95)
    (run / "final").mkdir()
    (run / "checkpoints" / "step_000010").mkdir(parents=True)
    assert reader.run_dir_of(run) == run.resolve()
    assert reader.run_dir_of(run / "final") == run.resolve()
    assert reader.run_dir_of(run / "final" / "final.pt") == run.resolve()
    assert reader.run_dir_of(run / "checkpoints" / "step_000010") is None
    assert reader.run_dir_of(tmp_path) is None
