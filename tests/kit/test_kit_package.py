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


@pytest.mark.slow
def test_phase_2_kit_package_ships_the_inference_py_beside_train_py(
    one_rank_run: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from trnfrontier.contract.inference_source import inference_py_source
    from trnfrontier.contract.launch import launch_line

    train_py, run_dir = one_rank_run
    team = tmp_path / "team"
    shutil.copytree(train_py.parent, team)
    checkpoint = json.loads((run_dir / "summary.json").read_text())["final_checkpoint"]
    args = ["package", "--train-py", str(team / "train.py"), "--checkpoint", checkpoint, "--launch", launch_line(64, 2),
            "--run-dir", str(run_dir), "--val-bpb-from-eval", "--phase", "2", "-o", str(tmp_path / "s.tar")]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "carry inference.py beside train.py" in err
    (team / "inference.py").write_text(inference_py_source())
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    code, out, err = run_cli(["verify", str(tmp_path / "s.tar"), "--json"], capsys)
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["launch"]["verdict"] == "pass" and checks["inference"]["verdict"] == "pass", checks["inference"]["reason"]
    code, _, err = run_cli(["package", str(run_dir), "--phase", "2"], capsys)
    assert code == 2 and "--phase is for kit mode" in err
