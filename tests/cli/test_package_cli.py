"""`trnf package` on the command line: one-line errors, --json, and kit mode (--train-py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.cli.test_app import run_cli
from tests.packaging import conftest as packaging
from tests.packaging.conftest import edit_summary
from tests.verify import verify_kit

# The packaging tests' fixtures (a real tiny run, and a copy to spoil), shared here.
tiny_run, run_copy = packaging.tiny_run, packaging.run_copy
LAUNCH = "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=1 train.py"


def test_package_json_and_usage_errors(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.tar"
    code, stdout, _ = run_cli(["package", str(tiny_run), "-o", str(out), "--json"], capsys)
    assert code == 0 and json.loads(stdout)["archive"] == str(out) and out.is_file()
    code, _, err = run_cli(["package", str(tmp_path / "nope")], capsys)
    assert (
        code == 2
        and err.count("trnf: error:") == 1
        and "no such run directory" in err.splitlines()[-1]
    )
    code, _, err = run_cli(["package", str(tiny_run), "--launch", LAUNCH], capsys)
    assert code == 2 and "kit mode" in err


def test_refusal_is_one_line_and_writes_nothing(
    run_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_summary(run_copy, status="diverged", diverged_step=2)
    out = tmp_path / "s.tar"
    code, _, err = run_cli(["package", str(run_copy), "-o", str(out)], capsys)
    assert (
        code == 1
        and err.splitlines()[-1].startswith("trnf: error: refusing to package")
        and err.count("trnf: error:") == 1
    )
    assert "'diverged' at step 2" in err and not out.exists()
    code, stdout, _ = run_cli(
        ["package", str(run_copy), "-o", str(out), "--force", "--json"], capsys
    )
    assert code == 0 and any("diverged" in reason for reason in json.loads(stdout)["forced"])


def test_kit_mode_ships_train_py_its_local_imports_and_logs(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kit = tmp_path / "kit"
    (kit / "helpers").mkdir(parents=True)
    (kit / "train.py").write_text(
        "import prepare\nimport torch\nfrom helpers import util\nfrom mylayers import Block\n\n\ndef load_for_eval(checkpoint_path, device):\n    return Block()\n"
    )
    (kit / "helpers" / "__init__.py").write_text("")
    (kit / "helpers" / "util.py").write_text("from . import deep\n")
    (kit / "helpers" / "deep.py").write_text("X = 1\n")
    (kit / "mylayers.py").write_text("import torch\nBlock = torch.nn.Identity\n")
    (kit / "unused.py").write_text("raise SystemExit\n")
    shutil.copy(Path(__file__).resolve().parents[2] / "prepare.py", kit / "prepare.py")
    out = tmp_path / "kit.tar"
    code, stdout, err = run_cli(
        [
            "package",
            "--train-py",
            str(kit / "train.py"),
            "--checkpoint",
            str(tiny_run / "final" / "final.pt"),
            "--launch",
            LAUNCH,
            "--run-dir",
            str(tiny_run),
            "-o",
            str(out),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    members = json.loads(stdout)["members"]
    assert {
        "train.py",
        "mylayers.py",
        "helpers/__init__.py",
        "helpers/util.py",
        "helpers/deep.py",
    } <= set(members)
    assert "unused.py" not in members and "prepare.py" not in members
    assert (
        json.loads(stdout)["claimed"]["val_bpb"]
        == json.loads((tiny_run / "summary.json").read_text())["val_bpb"]
    )


def test_kit_mode_says_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.py").write_text(verify_kit.TRAIN_PY)
    code, _, err = run_cli(
        [
            "package",
            "--train-py",
            str(tmp_path / "train.py"),
            "--checkpoint",
            str(tmp_path / "out" / "final.pt"),
            "--launch",
            LAUNCH,
        ],
        capsys,
    )
    assert code == 2 and "no such file" in err
    code, _, err = run_cli(
        [
            "package",
            "--train-py",
            str(tmp_path / "train.py"),
            "--checkpoint",
            "x.pt",
            "--launch",
            "torchrun train.py; rm -rf /",
        ],
        capsys,
    )
    assert code == 2 and "--launch" in err
