"""A kit run goes on: `trnf package --train-py` its train.py, checkpoint and run directory, then `trnf verify` the archive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kit_fixtures import run_cli, write_train_py

LAUNCH = "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=1 train.py"


@pytest.fixture(scope="module")
def one_rank_run(sample_home: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("kit1")
    train_py = write_train_py(root / "team", "good")
    run_dir = root / "runs" / "one"
    result = subprocess.run([sys.executable, "-m", "trnfrontier", "train", "--train-py", str(train_py), "--out", str(run_dir), "--timeout", "600"],
                            capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert result.returncode == 0, result.stderr[-3000:]
    return train_py, run_dir


@pytest.mark.slow
def test_package_then_verify_a_kit_run(one_rank_run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py, run_dir = one_rank_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (run_dir / "launch.txt").read_text().strip() == LAUNCH
    archive = tmp_path / "submission.tar"
    code, _, err = run_cli(["package", "--train-py", str(train_py), "--checkpoint", summary["final_checkpoint"], "--launch", LAUNCH,
                            "--run-dir", str(run_dir), "--val-bpb-from-eval", "-o", str(archive)], capsys)
    assert code == 0, err
    assert archive.is_file()
    code, out, err = run_cli(["verify", str(archive), "--json"], capsys)
    assert code == 0, out + err
    report = json.loads(out)
    assert all(c["ok"] for c in report["checks"]), report["checks"]
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    assert all(verdicts[name] == "pass" for name in ("budget", "contract", "launch", "screen", "checkpoint", "pin:prepare")), verdicts


@pytest.fixture(scope="module")
def phase_2_run(sample_home: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """A `--phase 2` run of the good fixture on one CPU rank (a local rehearsal's shape)."""
    root = tmp_path_factory.mktemp("kitp2")
    train_py = write_train_py(root / "team", "good")
    run_dir = root / "runs" / "p2"
    result = subprocess.run([sys.executable, "-m", "trnfrontier", "train", "--train-py", str(train_py), "--phase", "2",
                             "--out", str(run_dir), "--timeout", "600"],
                            capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr[-3000:]
    return train_py, run_dir, result


@pytest.mark.slow
def test_a_phase_2_kit_run_is_charged_against_14400_s(phase_2_run: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    _, run_dir, result = phase_2_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["phase"] == 2 and summary["status"] == "completed" and summary["problems"] == []
    assert summary["budget_seconds"] == 14_400 and summary["over_budget"] is False
    assert summary["headroom_seconds"] == pytest.approx(14_400 - summary["charged_seconds"])
    assert "/ 14400 s" in result.stdout  # the result table's charged / budget
    assert "note: --nproc 1 with --lnc 2 is not a valid Phase 2 launch (Phase 2 runs --nproc_per_node=64" in result.stderr
    assert "inference.py does not exist yet" in result.stderr and "--inference-only` writes one" in result.stderr


@pytest.mark.slow
def test_phase_2_kit_package_ships_the_inference_py_beside_train_py(
    phase_2_run: tuple[Path, Path, subprocess.CompletedProcess[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from trnfrontier.contract.inference_source import inference_py_source
    from trnfrontier.contract.launch import launch_line

    train_py, run_dir, _ = phase_2_run
    team = tmp_path / "team"
    shutil.copytree(train_py.parent, team)
    checkpoint = json.loads((run_dir / "summary.json").read_text())["final_checkpoint"]
    # No --phase: the run recorded Phase 2, and package follows it.
    args = ["package", "--train-py", str(team / "train.py"), "--checkpoint", checkpoint, "--launch", launch_line(64, 2),
            "--run-dir", str(run_dir), "--val-bpb-from-eval", "-o", str(tmp_path / "s.tar")]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "carry inference.py beside train.py" in err
    code, _, err = run_cli([*args, "--phase", "1"], capsys)
    assert code == 2 and "was trained as Phase 2" in err
    (team / "inference.py").write_text(inference_py_source())
    code, _, err = run_cli([*args, "--phase", "2"], capsys)  # saying what the run recorded is fine
    assert code == 0, err
    code, out, err = run_cli(["verify", str(tmp_path / "s.tar"), "--json"], capsys)
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["launch"]["verdict"] == "pass" and checks["inference"]["verdict"] == "pass", checks["inference"]["reason"]
    assert checks["budget"]["verdict"] == "pass" and "of 14400" in checks["budget"]["reason"], checks["budget"]
    code, _, err = run_cli(["package", str(run_dir), "--phase", "2"], capsys)
    assert code == 2 and "--phase is for kit mode" in err
