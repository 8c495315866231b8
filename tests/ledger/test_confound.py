"""What else differs between compared runs: step counts (CONFOUNDED) and the speed
environment, in `trnf compare`, `trnf runs` and the ablation table `trnf runs table`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from tests.ledger.fake_runs import make_run
from trnfrontier.ledger.confound import environment_differences, steps_differ
from trnfrontier.runtime import speed_env

ENV = {"NEURON_CC_FLAGS": "--optlevel 2", "lnc": 2, "world_size": 4, "host": "trn-a", "device": "neuron",
       "compile_cache": "warm", "versions": {"torch": "2.9.0", "torch-neuronx": "2.9.0.2", "neuronx-cc": "2.26", "nki": "0.6.0"}}  # fmt: skip


def _sides(root: Path, b_steps: int, b_env: dict | None = None) -> None:
    rng = random.Random(3)
    for i in range(3):
        make_run(root, f"a-s{i}", 0.950 + rng.gauss(0, 0.0003), seed=1337 + i, steps=100, speed_env=ENV)
        make_run(root, f"b-s{i}", 0.940 + rng.gauss(0, 0.0003), seed=1337 + i, steps=b_steps,
                 overrides=["optim.matrix_lr=0.03"], speed_env=b_env or ENV)  # fmt: skip


def test_steps_differ_beyond_ten_percent() -> None:
    assert not steps_differ(100, 91) and steps_differ(100, 89) and not steps_differ(0, 0)


def test_compare_flags_confounded_steps_and_names_the_environment(ledger_env: Path, capsys) -> None:
    _sides(ledger_env, b_steps=80, b_env={**ENV, "NEURON_CC_FLAGS": None, "host": "trn-b"})
    code, out, err = run_cli(["compare", "a-s0", "b-s0", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["verdict"] == "confounded" and doc["confounded"]["steps_a"] == 100 and doc["confounded"]["steps_b"] == 80
    assert doc["message"].startswith("CONFOUNDED: A trained 100 steps and B 80 (20% apart")
    assert "B better by" in doc["message"]  # the numbers are still there, qualified
    assert [d["key"] for d in doc["environment_differences"]] == ["NEURON_CC_FLAGS", "host"]
    assert "NEURON_CC_FLAGS --optlevel 2 vs unset; host trn-a vs trn-b" in doc["message"]


def test_equal_steps_and_environment_compare_as_before(ledger_env: Path, capsys) -> None:
    _sides(ledger_env, b_steps=95)
    code, out, _ = run_cli(["compare", "a-s0", "b-s0", "--json"], capsys)
    doc = json.loads(out)
    assert doc["verdict"] == "B better" and doc["confounded"] is None and doc["environment_differences"] == []


def test_runs_without_a_recorded_environment_are_not_a_difference() -> None:
    recorded = [{"speed_env": ENV}]
    assert environment_differences(recorded, [{"speed_env": None}]) == []
    assert environment_differences(recorded, [{"speed_env": {**ENV, "versions": {**ENV["versions"], "nki": "0.7.0"}}}]) == [
        {"key": "versions.nki", "a": ["0.6.0"], "b": ["0.7.0"]}
    ]


def test_the_speed_record_reads_the_environment_without_importing_neuron(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"NEURON_CC_FLAGS": f"--optlevel 1 --cache_dir={cache}", "NEURON_LOGICAL_NC_CONFIG": "1"}
    cold = speed_env.capture(world_size=8, device="neuron", env=env)
    assert cold["compile_cache"] == "cold" and cold["compile_cache_path"] == str(cache)
    assert cold["lnc"] == 1 and cold["world_size"] == 8 and cold["NEURON_CC_FLAGS"].startswith("--optlevel 1")
    assert cold["versions"]["torch"] and cold["versions"]["torch-neuronx"] is None
    (cache / "MODULE_1").mkdir(parents=True)
    assert speed_env.capture(world_size=8, device="neuron", env=env)["compile_cache"] == "warm"
    assert speed_env.capture(world_size=1, device="cpu", env={})["compile_cache"] == "none"
    assert speed_env.cache_state("s3://bucket/cache") == "remote"


@pytest.mark.parametrize("fmt", ["md", "latex", "csv"])
def test_the_ablation_table_by_a_key(ledger_env: Path, capsys, fmt: str) -> None:
    rng = random.Random(5)
    for lr, mean, steps in ((0.02, 0.950, 100), (0.03, 0.945, 100), (0.05, 0.960, 70)):
        for i in range(3):
            make_run(ledger_env, f"lr{lr}-s{i}", mean + rng.gauss(0, 0.0003), seed=1337 + i, steps=steps,
                     overrides=[f"optim.matrix_lr={lr}"], speed_env=ENV, sweep={"id": "lr-1", "params": {"optim.matrix_lr": lr}})  # fmt: skip
    code, out, err = run_cli(["runs", "table", "--by", "optim.matrix_lr", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["baseline"] == "0.02" and [r["value"] for r in doc["rows"]] == ["0.02", "0.03", "0.05"]
    base, better, slower = doc["rows"]
    assert base["n"] == 3 and base["difference"] is None and base["ci_half_width"] > 0
    assert better["difference"]["high"] < 0 and better["confounded"] is None
    assert slower["confounded"]["steps_b"] == 70 and slower["difference"]["low"] > 0

    code, out, _ = run_cli(["runs", "table", "--by", "optim.matrix_lr", "--format", fmt, "--sweep", "lr-*", "--baseline", "0.03"], capsys)
    assert code == 0
    lines = out.strip().splitlines()
    if fmt == "md":
        assert lines[0].startswith("| optim.matrix_lr | n | val_bpb mean |") and len(lines) == 5
        assert "baseline" in lines[3] and "CONFOUNDED (steps)" in lines[4]
    elif fmt == "latex":
        assert lines[0].startswith(r"\begin{tabular}") and r"optim.matrix\_lr" in lines[2] and r"$\pm$" in out
    else:
        assert lines[0].startswith("optim.matrix_lr,n,val_bpb mean,sd,95% CI,steps,vs 0.03,p,note") and len(lines) == 4


def test_the_ablation_table_refuses_an_unknown_key_in_one_line(ledger_env: Path, capsys) -> None:
    make_run(ledger_env, "x", 0.95)
    code, _, err = run_cli(["runs", "table", "--by", "optim.no_such"], capsys)
    assert code == 2 and "--by optim.no_such: run x has no such recipe key or sweep parameter" in err
    code, _, err = run_cli(["runs", "table", "--by", "optim.matrix_lr", "--format", "html"], capsys)
    assert code == 2 and "--format html: one of md, latex, csv" in err


def test_a_kit_run_is_in_the_ledger_with_its_speed_environment(ledger_env: Path, capsys) -> None:
    run = ledger_env / "kit-run"
    run.mkdir()
    summary = {"mode": "kit", "status": "completed", "val_bpb": None, "steps": 50, "train_py": "/team/train.py",
               "train_py_sha256": "c" * 64, "launch": "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 train.py",
               "world_size": 4, "lnc": 2, "speed_env": ENV}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "provenance.json").write_text(json.dumps({"recipe_ref": "/team/train.py", "overrides": ["--lr", "0.1"],
                                                     "sweep": {"id": "k-1", "trial": "t0", "params": {"--lr": 0.1}}}))  # fmt: skip
    code, out, err = run_cli(["runs", "--json"], capsys)
    assert code == 0, err
    (found,) = json.loads(out)["runs"]
    assert found["name"] == "kit-run" and found["recipe"] == "train.py" and found["lnc"] == 2
    assert found["speed_env"]["host"] == "trn-a" and found["sweep"] == "k-1" and found["sweep_params"] == {"--lr": 0.1}


def test_the_ablation_table_names_what_a_row_pools_and_what_it_leaves_out(ledger_env: Path, capsys) -> None:  # noqa: F811
    """A sweep over two keys read by one: each row's mean pools the other key, which the
    table says; the trials ASHA stopped or that failed are counted per setting, also for a
    setting none of whose trials got a score."""
    rng = random.Random(7)

    def trial(name: str, lr: float, depth: int, seed: int, status: str = "completed") -> None:
        params = {"optim.matrix_lr": lr, "model.depth": depth, "runtime.seed": seed}
        make_run(ledger_env, name, 0.95 + rng.gauss(0, 0.0003) if status == "completed" else None, seed=seed,
                 overrides=[f"optim.matrix_lr={lr}", f"model.depth={depth}"], status=status, speed_env=ENV,
                 sweep={"id": "two-1", "params": params})  # fmt: skip

    for i, depth in enumerate((1, 2, 1, 2)):
        trial(f"a{i}", 0.02, depth, 1337 + i)
    trial("b0", 0.04, 1, 1337)
    trial("b1", 0.04, 1, 1338)
    trial("b2", 0.04, 2, 1339, status="interrupted")  # what ASHA's stop leaves in the ledger
    trial("b3", 0.04, 2, 1340, status="crashed")
    trial("c0", 0.5, 1, 1337, status="interrupted")
    trial("c1", 0.5, 2, 1338, status="diverged")

    code, out, err = run_cli(["runs", "table", "--by", "optim.matrix_lr", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    base, other = doc["rows"]
    assert [base["value"], other["value"]] == ["0.02", "0.04"] and base["n"] == 4 and other["n"] == 2
    assert base["pooled"] == {"model.depth": ["1", "2"]} and other["pooled"] == {}  # b0, b1 are both depth 1
    assert base["left_out"] == {} and other["left_out"] == {"stopped": 1, "failed": 1}
    assert doc["left_out"] == {"0.04": {"stopped": 1, "failed": 1}, "0.5": {"stopped": 1, "failed": 1}}
    assert doc["notes"] == [
        "note: rows pool runs in which other keys vary too (0.02: model.depth 1/2)",
        "note: left out, with no score (optim.matrix_lr = 0.04: 1 stopped, 1 failed; 0.5: 1 stopped, 1 failed)",
    ]

    code, out, _ = run_cli(["runs", "table", "--by", "optim.matrix_lr"], capsys)
    assert code == 0
    lines = out.strip().splitlines()
    assert "pools model.depth" in lines[2] and "left out 1 stopped, 1 failed" in lines[3]
    assert lines[4] == "" and lines[5:] == doc["notes"]
    code, out, _ = run_cli(["runs", "table", "--by", "optim.matrix_lr", "--format", "csv"], capsys)
    assert len(out.strip().splitlines()) == 3 and "left out 1 stopped, 1 failed" in out  # one table, no note lines
    code, out, _ = run_cli(["runs", "table", "--by", "optim.matrix_lr", "--format", "latex"], capsys)
    assert out.strip().splitlines()[-1].startswith("% note: left out, with no score (optim.matrix\\_lr = 0.04")
