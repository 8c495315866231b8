"""`trnf train` end to end through the real entry point, on the sample corpus."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli_run import run_cli

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.depth=1",
    "model.n_embd=64",
    "model.head_dim=32",
    "model.n_kv_head=1",
    "model.sequence_len=32",
    "data.batch_size=4",
    "runtime.threads=1",
    "eval.tokens=2048",
    "eval.seq_len=32",
    "eval.batch_size=8",
    "budget.startup_steps_excluded=1",
    "run.checkpoint_every_seconds=0.001",
]


@pytest.fixture(autouse=True)
def _project_prepare(monkeypatch) -> None:
    monkeypatch.setenv("TRNF_PREPARE", str(REPO / "prepare.py"))


@pytest.mark.slow
def test_train_json_summary_and_run_dir(sample_home: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    steps = [
        "schedule.mode=steps",
        "schedule.total_steps=4",
    ]  # a step-driven LR: the resumed run is exact
    code, out, err = run_cli(
        ["train", "cpu_smoke", *TINY, *steps, "--out", str(run), "--json"], capsys
    )
    assert code == 0, err
    summary = json.loads(out)  # stdout is exactly one JSON document
    assert summary["status"] == "completed" and summary["steps"] == 4
    assert isinstance(summary["val_bpb"], float)
    for name in (
        "recipe.json",
        "metrics.jsonl",
        "step_boundaries.jsonl",
        "summary.json",
        "train.log",
        "final/final.pt",
    ):
        assert (run / name).exists(), name
    assert json.loads((run / "recipe.json").read_text())["model"]["n_embd"] == 64

    # The run dir now exists: a second run there is refused, nothing is touched.
    before = (run / "summary.json").read_bytes()
    code, out, err = run_cli(["train", "cpu_smoke", *TINY, "--out", str(run)], capsys)
    assert code == 2 and "holds a run that completed" in err and "--resume" not in err and out == ""
    assert (run / "summary.json").read_bytes() == before

    # Completed runs are not resumed.
    code, _, err = run_cli(["train", "--resume", str(run)], capsys)
    assert code == 2 and "already completed" in err

    # A run killed before its end (simulated: no final, no summary) resumes to completion.
    shutil.rmtree(run / "final")
    (run / "summary.json").unlink()
    # recipe.json is what a resume trains with: one that differs from the recipe the
    # checkpoint recorded (a stray edit, a flipped byte) is refused, not trained.
    original = (run / "recipe.json").read_bytes()
    edited = json.loads(original)
    edited["optim"]["matrix_lr"] *= 1.5
    (run / "recipe.json").write_text(json.dumps(edited))
    code, _, err = run_cli(["train", "--resume", str(run)], capsys)
    assert code == 2 and "recipe.json differs from the recipe" in err and '"recipe" object of' in err
    (run / "recipe.json").write_bytes(original)
    code, out, err = run_cli(["train", "--resume", str(run), "--json"], capsys)
    assert code == 0, err
    resumed = json.loads(out)
    assert resumed["status"] == "completed" and resumed["steps"] == 4 and resumed["resumed_from"]
    assert resumed["val_bpb"] == summary["val_bpb"]


def test_train_table_output(sample_home: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(
        ["train", "cpu_smoke", *TINY, "budget.max_steps=2", "eval.final=false", "--name", "t1"],
        capsys,
    )
    assert code == 0, err
    assert "completed" in out and "charged" in out
    assert (tmp_path / "runs" / "t1" / "summary.json").is_file()


def test_diverged_run_exits_non_zero_naming_the_step(
    sample_home: Path, tmp_path: Path, capsys
) -> None:
    run = tmp_path / "run"
    code, out, err = run_cli(
        [
            "train",
            "cpu_smoke",
            *TINY,
            "budget.max_steps=3",
            "run.max_loss=5",
            "--out",
            str(run),
            "--json",
        ],
        capsys,
    )
    assert code == 1
    assert json.loads(out)["status"] == "diverged"
    assert "diverged at step 1" in err and "step_000000" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["cpu_smoke", "optim.matrix_lrr=0.1"], "optim.matrix_lrr"),
        (["cpu_smoke", "optim.matrix_lr=-1"], "optim.matrix_lr"),
        (["cpu_smoke", "budget.seconds=5000"], "1800"),
        (["cpu_smoke", "model.vocab_size=4096"], "TOKENIZER_VOCAB_SIZE"),
        (["cpu_smoke", "--fast"], "unknown option"),
        (["no_such_recipe"], "not found"),
        ([], "give a RECIPE"),
        (["--resume", "/nonexistent/run"], "no such directory"),
        (["cpu_smoke", "--name", "../elsewhere"], "--name '../elsewhere': a run name is"),
        (["cpu_smoke", "--name", "two words"], "--name 'two words': a run name is"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    sample_home: Path, tmp_path: Path, capsys, monkeypatch, args, message
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["train", *args], capsys)
    assert code == 2, err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing half-written


def test_resume_of_a_directory_that_is_not_a_run(sample_home: Path, tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(["train", "--resume", str(tmp_path)], capsys)
    assert code == 2 and "not a run directory" in err


def test_missing_dataset_is_a_clear_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRNF_DATASET", raising=False)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["train", "cpu_smoke"], capsys)
    assert code == 1 and "trnf prepare" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_a_crash_in_the_worker_is_reported_with_its_log(
    sample_home: Path, tmp_path: Path, capsys
) -> None:
    # An eval context longer than the whole validation split: training completes, then the
    # trusted evaluate_bpb refuses, and the worker dies with that error.
    run = tmp_path / "run"
    code, out, err = run_cli(
        [
            "train",
            "cpu_smoke",
            *TINY,
            "budget.max_steps=2",
            "eval.seq_len=1000000",
            "--out",
            str(run),
        ],
        capsys,
    )
    assert code == 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "crashed" and "fewer than one row" in summary["error"]
    assert (
        "training crashed" in err and "train.log" in err and "fewer than one row" in err
    )  # the log tail, then one line
    assert err.strip().splitlines()[-1].startswith("trnf: error: training crashed")


def test_kit_only_flags_are_refused_for_recipe_runs(
    sample_home: Path, tmp_path: Path, capsys
) -> None:
    for flags in (["--timeout", "5"], ["--dry-run"], ["--steps", "3"]):
        code, _, err = run_cli(["train", "cpu_smoke", *flags, "--out", str(tmp_path / "r")], capsys)
        assert code == 2 and "--train-py" in err, flags
    code, _, err = run_cli(
        ["train", "--train-py", str(tmp_path / "train.py"), "--resume", str(tmp_path)], capsys
    )
    assert code == 2 and "--resume" in err


def test_lnc_sets_runtime_lnc(sample_home: Path, tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(
        ["train", "cpu_smoke", "--lnc", "3", "--out", str(tmp_path / "r")], capsys
    )
    assert code == 2 and "runtime.lnc" in err
