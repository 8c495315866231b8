"""`trnf train --train-py ... --dry-run`: the team's file for a few CPU steps in the clean environment."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from kit_fixtures import run_cli, write_train_py

from trnfrontier.kit.dryrun import STAGES, DryRunReport, copy_code
from trnfrontier.progress import Steps


def test_code_copy_takes_python_files_not_prepare_outputs_or_environments(tmp_path: Path) -> None:
    src = tmp_path / "team"
    for name in ("train.py", "prepare.py", "kernels/relu2.py", "kernels/deep/a/b.py", "out/x.py", ".git/h.py", "venv/lib/m.py", "notes.txt"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("# x\n")
    (src / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    copied = copy_code(src, tmp_path / "dest")
    assert copied == ["kernels/relu2.py", "train.py"]
    assert (tmp_path / "dest" / "kernels" / "relu2.py").is_file()


def test_source_stage_fails_without_load_for_eval(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = tmp_path / "train.py"
    train_py.write_text("print('no loader')\n")
    code, out, err = run_cli(["train", "--train-py", str(train_py), "--dry-run", "--json"], capsys)
    assert code == 1
    stages = json.loads(out)["stages"]
    assert [s["name"] for s in stages] == list(STAGES)
    assert stages[0]["passed"] is False and all(s["passed"] is None for s in stages[1:])
    assert "trnf: error: dry run failed at source" in err and "defines no load_for_eval" in err


@pytest.mark.slow
def test_good_script_passes_every_stage_on_two_ranks(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = write_train_py(tmp_path / "team", "good")
    kept = tmp_path / "dry"
    code, out, err = run_cli(["train", "--train-py", str(train_py), "--dry-run", "--nproc", "2", "--steps", "3", "--out", str(kept), "--json"], capsys)
    assert code == 0, err
    document = json.loads(out)
    assert document["passed"] is True
    stages = {s["name"]: s for s in document["stages"]}
    assert all(s["passed"] for s in stages.values())
    assert "step log recorded 3 steps" in stages["steps"]["detail"]
    assert "rank 0: 3, rank 1: 3" in stages["steps"]["detail"]  # each rank's own log shows its steps
    assert "out/final.pt" in stages["load_for_eval"]["detail"]
    # It ran on a copy: the team's directory got no checkpoint from the dry run.
    assert not (train_py.parent / "out").exists()
    assert (kept / "run" / "out" / "final.pt").is_file() and (kept / "logs" / "rank1.stdout.log").is_file()


@pytest.mark.slow
def test_an_abort_in_python_shutdown_after_finishing_passes_with_a_word(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = write_train_py(tmp_path / "team", "exitabort")
    code, out, err = run_cli(["train", "--train-py", str(train_py), "--dry-run", "--nproc", "2", "--steps", "3", "--json"], capsys)
    assert code == 0, err[-3000:]
    stages = {s["name"]: s for s in json.loads(out)["stages"]}
    assert all(s["passed"] for s in stages.values()), stages
    # rank 1's, or rank 0's when torch's own gloo race aborted it first (the same signature)
    assert re.search(r"finished \(rank [01] then aborted in Python's shutdown", stages["steps"]["detail"])
    assert "step log recorded 3 steps" in stages["steps"]["detail"]


@pytest.mark.slow
def test_crash_on_rank_1_fails_the_steps_stage_with_its_traceback(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = write_train_py(tmp_path / "team", "crash")
    code, out, err = run_cli(["train", "--train-py", str(train_py), "--dry-run", "--nproc", "2"], capsys)
    assert code == 1
    assert "trnf: error: dry run failed at steps: rank 1 failed" in err
    # The failure names its log, which is kept (the rest of the work directory with it).
    named = re.search(r"\(log: (\S+)\)\n", err)
    assert named, err[-2000:]
    log = Path(named.group(1))
    try:
        assert log.is_file() and "injected failure on rank 1" in log.read_text()
        assert f"last lines of {log}:" in err
    finally:
        kept = [p for p in log.parents if p.name.startswith("trnf-dry-run-")]
        if kept:
            shutil.rmtree(kept[0], ignore_errors=True)
    assert "RuntimeError: injected failure on rank 1 at step 2" in err
    assert "start" in out and "FAIL" in out


@pytest.mark.slow
def test_dry_run_reads_the_default_data_home(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A default install: TRNF_HOME unset, the data in ~/.cache/trnfrontier."""
    user = tmp_path / "user"
    (user / ".cache").mkdir(parents=True)
    (user / ".cache" / "trnfrontier").symlink_to(sample_home)
    monkeypatch.setenv("HOME", str(user))
    monkeypatch.delenv("TRNF_HOME")
    train_py = write_train_py(tmp_path / "team", "good")
    code, out, err = run_cli(["train", "--train-py", str(train_py), "--dry-run", "--steps", "2", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["passed"] is True


def test_each_stage_advances_the_progress_and_names_the_next() -> None:
    seen: list[str] = []

    class Recorder(Steps):
        def describe(self, description: str) -> None:
            seen.append(description)

    bar = Recorder()
    report = DryRunReport(progress=bar)
    report.add("source", True, "ok")
    report.add("environment", True, "ok")
    report.add("start", False, "rank 0 failed")
    assert bar.done == 3
    assert seen == ["dry run: building the clean environment (a venv with the organisers' packages)",
                    "dry run: launching train.py under torchrun (gloo, CPU)"]
