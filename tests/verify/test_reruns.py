"""--rerun-eval (the trusted evaluate_bpb in a fresh process) and --dry-run (train.py in the clean environment)."""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

import pytest
from verify_kit import LAUNCH, RERUN, TRAIN_PY, build_archive, good_meta, pins_file

from trnfrontier.kit.harness import build_clean_env
from trnfrontier.verify import Options, verify_archive

REPO = Path(__file__).resolve().parents[2]


def _true_bpb(src: Path, prepare_module) -> float:
    """The score of the tiny model as the trusted scorer computes it, in this process."""
    module = types.ModuleType("tiny_train")
    exec(compile(TRAIN_PY, "train.py", "exec"), module.__dict__)
    model = module.load_for_eval(str(src / "checkpoint" / "final.pt"), "cpu")
    tokenizer = prepare_module.ensure_tokenizer()
    return float(prepare_module.evaluate_bpb(model, tokenizer, 4, seq_len=32, max_tokens=4096)["val_bpb"])


@pytest.mark.slow
def test_rerun_eval_reproduces_an_honest_claim_and_refuses_a_false_one(sample_home: Path, prepare_module, tmp_path: Path) -> None:
    (tmp_path / "honest").mkdir()
    (tmp_path / "false").mkdir()
    honest = build_archive(tmp_path / "honest")
    bpb = _true_bpb(tmp_path / "honest" / "submission.tar.src", prepare_module)
    meta = good_meta()
    meta["claimed"]["val_bpb"] = bpb
    honest = build_archive(tmp_path / "honest", meta=meta)
    report = verify_archive(honest, Options(pins_file=pins_file(tmp_path), rerun_eval=True, **RERUN))
    reason = report.get("rerun-eval").reason
    assert report.get("rerun-eval").verdict == "pass", reason
    # Exactly the in-process score: the check rows mixed into the scored pass leave the honest score alone.
    rerun_bpb = float(reason.split(" gives ", 1)[1].split(",", 1)[0])
    assert abs(rerun_bpb - bpb) <= 1e-6, (rerun_bpb, bpb)
    assert "check rows inside the scored pass" in reason and "the model is the checkpoint's" in reason

    meta["claimed"]["val_bpb"] = bpb - 0.05  # a better score than the model earns
    lying = build_archive(tmp_path / "false", meta=meta)
    report = verify_archive(lying, Options(pins_file=pins_file(tmp_path), rerun_eval=True, **RERUN))
    check = report.get("rerun-eval")
    assert check.verdict == "fail" and "claimed" in check.reason
    assert report.exit_code == 1


def test_rerun_eval_without_a_dataset_fails_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "no_home"))
    monkeypatch.delenv("TRNF_DATASET", raising=False)
    report = verify_archive(build_archive(tmp_path), Options(pins_file=pins_file(tmp_path), rerun_eval=True, **RERUN))
    check = report.get("rerun-eval")
    assert check.verdict == "fail" and "no prepared dataset" in check.reason


def test_clean_environment_has_only_the_organisers_packages(tmp_path: Path) -> None:
    python = build_clean_env(tmp_path, REPO / "prepare.py")
    ok = subprocess.run([str(python), "-I", "-c", "import torch, numpy, tiktoken, pyarrow, prepare; print(prepare.VAL_SHARD)"],
                        capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0 and ok.stdout.strip() == "6542", ok.stderr[-500:]
    for name in ("trnfrontier", "pydantic", "typer", "rich", "yaml", "safetensors", "pytest"):
        res = subprocess.run([str(python), "-I", "-c", f"import {name}"], capture_output=True, text=True, cwd=REPO)
        assert res.returncode != 0 and "ModuleNotFoundError" in res.stderr, name


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 4])
def test_dry_run_trains_checkpoints_and_loads_without_trnf(nproc: int, tmp_path: Path) -> None:
    launch = LAUNCH.replace("--nproc_per_node=1", f"--nproc_per_node={nproc}")
    archive = build_archive(tmp_path, launch=launch)
    report = verify_archive(archive, Options(pins_file=pins_file(tmp_path), dry_run=True, dry_run_steps=2))
    check = report.get("dry-run")
    assert check.verdict == "pass", check.reason
    assert f"{nproc} process(es)" in check.reason and "TRNF_DRY_RUN_STEPS=2" in check.reason
    assert report.ok


@pytest.mark.slow
def test_dry_run_fails_a_script_that_crashes_at_run_time(tmp_path: Path) -> None:
    """A train.py that passes every static check but crashes when it runs fails the dry run."""
    crashing = TRAIN_PY.replace("def main():\n", "def main():\n    raise ValueError('boom: cannot train')\n")
    report = verify_archive(build_archive(tmp_path, train_py=crashing), Options(pins_file=pins_file(tmp_path), dry_run=True))
    check = report.get("dry-run")
    # The reason names the exception, not torchrun's closing banner.
    assert check.verdict == "fail" and "exited" in check.reason and "ValueError: boom: cannot train" in check.reason
