"""`trnf init DIR`: the generated single-file train.py trains on the CPU, packages and verifies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_app import run_cli
from tests.runtime.test_checkpoint_integrity import flip_byte
from tests.runtime.test_trainer import TINY
from trnfrontier import submission as fmt
from trnfrontier.verify import Options, verify_archive

REPO = Path(__file__).resolve().parents[2]
LAUNCH = "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=1 train.py"


def test_init_writes_train_py_and_readme_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["init", str(tmp_path / "team")], capsys)
    assert code == 0, err
    source = (tmp_path / "team" / "train.py").read_text()
    assert "def load_for_eval(" in source and "def train(" in source and "class Muon" in source
    assert "from trnfrontier" not in source and len(source.encode()) <= fmt.PORTAL_FILE_LIMIT_BYTES
    assert "'name': 'baseline_d10'" in source
    readme = (tmp_path / "team" / "README.md").read_text()
    assert "python train.py" in readme and "prepare.py" in readme and "--nproc_per_node=4" in readme
    # The trusted prepare.py and the artifacts/ its setup needs are copied beside train.py.
    assert (tmp_path / "team" / "prepare.py").read_bytes() == (REPO / "prepare.py").read_bytes()
    assert (tmp_path / "team" / "artifacts" / "tokenizer.zip").read_bytes() == (REPO / "artifacts" / "tokenizer.zip").read_bytes()
    assert "`artifacts/` folder" in readme and "fails without it" in readme
    code, _, err = run_cli(["init", str(tmp_path / "team")], capsys)
    assert code == 2 and "--force" in err
    code, _, err = run_cli(
        ["init", str(tmp_path / "t2"), "--recipe", "cpu_smoke", "model.no_such_key=1"], capsys
    )
    assert code == 2 and "no_such_key" in err


def test_init_phase_2_writes_inference_py_beside_train_py(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["init", str(tmp_path / "final"), "--phase", "2"], capsys)
    assert code == 0, err
    assert "inference.py" in out and not (tmp_path / "final" / "inference.py").read_text().count("from trnfrontier")
    assert "'name': 'phase2_d22'" in (tmp_path / "final" / "train.py").read_text()
    readme = (tmp_path / "final" / "README.md").read_text()
    assert "--nproc_per_node=64" in readme and "inference.py" in readme
    # Another recipe made a Phase 2 one; a Phase 1 init writes no inference.py.
    code, _, err = run_cli(["init", str(tmp_path / "own"), "--phase", "2", "--recipe", "cpu_smoke", "runtime.nproc=64"], capsys)
    assert code == 0, err
    assert (tmp_path / "own" / "inference.py").is_file()
    code, _, err = run_cli(["init", str(tmp_path / "one"), "--recipe", "cpu_smoke"], capsys)
    assert code == 0 and not (tmp_path / "one" / "inference.py").exists()
    code, _, err = run_cli(["init", str(tmp_path / "bad"), "--phase", "2", "--recipe", "cpu_smoke"], capsys)
    assert code == 1 and "not a Phase 2 launch" in err


def test_init_inference_only_writes_inference_py_beside_a_teams_own_train_py(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "team"
    team.mkdir()
    (team / "train.py").write_text("# the team's own\n")
    code, out, err = run_cli(["init", str(team), "--inference-only"], capsys)
    assert code == 0, err
    written = (team / "inference.py").read_text()
    assert "train.load_for_eval(" in written and "def next_token_logprobs(" in written
    assert sorted(p.name for p in team.iterdir()) == ["inference.py", "train.py"]  # nothing else touched
    assert (team / "train.py").read_text() == "# the team's own\n" and "note:" not in out
    code, _, err = run_cli(["init", str(team), "--inference-only"], capsys)
    assert code == 2 and "already exists" in err and "--force" in err
    assert run_cli(["init", str(team), "--inference-only", "--force"], capsys)[0] == 0
    code, out, _ = run_cli(["init", str(tmp_path / "empty"), "--inference-only"], capsys)
    assert code == 0 and "train.py does not exist yet" in out
    for wrong in (["--phase", "1"], ["--recipe", "cpu_smoke"], ["model.depth=2"]):
        code, _, err = run_cli(["init", str(tmp_path / "x"), "--inference-only", *wrong], capsys)
        assert code == 2 and "--inference-only" in err and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_init_output_trains_on_cpu_packages_and_verifies(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    team = tmp_path / "team"
    code, _, err = run_cli(
        ["init", str(team), "--recipe", "cpu_smoke", *TINY, "budget.max_steps=3"], capsys
    )
    assert code == 0, err
    # TRNF_STEP_LOG too: an earlier in-process train() in this pytest session leaves it set,
    # and a generated train.py honours it (see the --train-py test below).
    drop = ("TRNF_PREPARE", "PYTHONPATH", "TRNF_STEP_LOG")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "train.py"], cwd=team, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for name in (
        "final.pt",
        "model.safetensors",
        "meta.json",
        "manifest.json",  # what `trnf eval` and `trnf package` check the published files against
        "run/summary.json",
        "run/step_boundaries.jsonl",
    ):
        assert (team / "out" / name).is_file(), name
    summary = json.loads((team / "out" / "run" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["val_bpb"] is not None

    out = tmp_path / "s.tar"
    code, stdout, err = run_cli(
        [
            "package",
            "--train-py",
            str(team / "train.py"),
            "--checkpoint",
            str(team / "out" / "final.pt"),
            "--launch",
            LAUNCH,
            "-o",
            str(out),
            "--json",
            "--val-bpb-from-eval",
        ],
        capsys,
    )
    assert code == 0, err
    document = json.loads(stdout)
    # the trusted evaluation of out/final.pt through the file's own load_for_eval gives the trainer's number
    assert document["claimed"]["val_bpb"] == summary["val_bpb"] and document["forced"] == []
    assert document["claimed"]["measured_by"].startswith("trnf package --val-bpb-from-eval")
    assert {
        "train.py",
        "logs/summary.json",
        "logs/step_boundaries.jsonl",
        "checkpoint/model.safetensors",
    } <= set(document["members"])
    claim = document["claimed"]
    report = verify_archive(out, Options(dry_run=True, dry_run_steps=2, rerun_eval=True, eval_tokens=claim["eval_tokens"],
                                         eval_seq_len=claim["eval_seq_len"]))
    assert report.ok, [(c.name, c.reason) for c in report.checks if not c.ok]

    flip_byte(team / "out" / "final.pt", 0.6)  # a real flipped byte in the real checkpoint
    code, _, err = run_cli(
        ["package", "--train-py", str(team / "train.py"), "--checkpoint", str(team / "out" / "final.pt"),
         "--launch", LAUNCH, "-o", str(tmp_path / "t.tar"), "--val-bpb-from-eval"],
        capsys,
    )
    assert code == 1 and "final.pt is damaged (its SHA256 differs" in err and "refusing to package it" in err
    assert not (tmp_path / "t.tar").exists()


@pytest.mark.slow
def test_init_output_through_the_readme_kit_flow_as_written(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's kit-mode lines, typed in the folder `trnf init` wrote (the outside's case:
    package said "no measured val_bpb" and the run's table "val_bpb printed by train.py: -"
    although train.py printed it). The generated train.py ends with the kit's `---` block."""
    team = tmp_path / "team"
    code, _, err = run_cli(["init", str(team), "--recipe", "cpu_smoke", *TINY, "budget.max_steps=3"], capsys)
    assert code == 0, err
    env = {k: v for k, v in os.environ.items() if k not in ("TRNF_PREPARE", "PYTHONPATH", "TRNF_STEP_LOG")}
    env["COLUMNS"] = "200"

    def trnf(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trnfrontier", "--prepare", "prepare.py", *args],
                              cwd=team, env=env, capture_output=True, text=True, timeout=900)

    run = trnf("train", "--train-py", "train.py", "--out", "runs/r1")
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((team / "runs" / "r1" / "summary.json").read_text())
    printed = summary["kit_summary"]["public_val_bpb"]
    assert isinstance(printed, float) and summary["reported_val_bpb"] == printed
    assert summary["kit_summary"]["num_steps"] == 3 and summary["step_log_start"]["source"] == "the log's header line"
    # The generated train.py honours the kit's out-dir knob: the checkpoint is the run's own.
    assert summary["out_dir_ignored"] is False and not (team / "out").exists()
    assert summary["final_checkpoint"] == str(team / "runs" / "r1" / "out" / "final.pt")
    assert f"{printed:.4f} (untrusted)" in run.stdout  # the table's "val_bpb printed by train.py"
    package = trnf("package", "--train-py", "train.py", "--run-dir", "runs/r1", "-o", "submission.tar", "--json")
    assert package.returncode == 0, package.stderr[-3000:]
    document = json.loads(package.stdout)
    assert document["launch"] == LAUNCH and document["claimed"]["val_bpb"] == printed
    report = verify_archive(team / "submission.tar", Options())
    assert report.ok, [(c.name, c.reason) for c in report.checks if not c.ok]


def test_init_where_nothing_can_be_written_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    code, out, err = run_cli(["init", str(blocker / "entry")], capsys)
    assert code == 1 and out == ""
    assert err.strip() == f"trnf: error: {blocker / 'entry'}: cannot write train.py there (Not a directory); choose a writable directory"
