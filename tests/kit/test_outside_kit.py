"""The documented kit flow on a kit written from the public evidence alone
(tests/fixtures/outside_kit/, not the project's stub kit): its record_step_boundary appends
plain {"step", "time"} lines with no header, which trnf must read, starting the clock at its
own launch of the run and saying so, without blaming train.py for a format it did not know.

Every command is typed as the README types it, in the kit's folder, in a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "tests" / "fixtures" / "outside_kit"


def _cache(directory: Path, prepare_module: ModuleType) -> Path:
    """$NEURON_COMPETITION_R1_CACHE_DIR as the kit's setup leaves it: parquet shards with a
    text column (06542 is validation), real English from the offline sample corpus."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [d for d in prepare_module.sample_documents() if len(d) > 300]
    (directory / "data").mkdir(parents=True)
    for name, texts in (("shard_00000", docs[:300]), ("shard_06542", docs[-80:])):
        pq.write_table(pa.table({"text": texts}), directory / "data" / f"{name}.parquet", row_group_size=40)
    return directory


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory, prepare_module: ModuleType) -> tuple[Path, dict[str, str]]:
    """The kit's folder (prepare.py, train.py, artifacts/) and the environment of its shell."""
    root = tmp_path_factory.mktemp("outside_kit")
    folder = root / "kit"
    folder.mkdir()
    for name in ("prepare.py", "train.py"):
        shutil.copyfile(KIT / name, folder / name)
    (folder / "artifacts").mkdir()
    shutil.copyfile(REPO / "artifacts" / "tokenizer.zip", folder / "artifacts" / "tokenizer.zip")
    env = {k: v for k, v in os.environ.items() if k not in ("TRNF_PREPARE", "TRNF_DATASET", "TRNF_STEP_LOG")}
    env.update({
        "NEURON_COMPETITION_R1_CACHE_DIR": str(_cache(root / "cache", prepare_module)),
        "NEURON_COMPETITION_R1_NUM_STEPS": "10",
        "NEURON_COMPETITION_R1_EVAL_TOKENS": "4096",
        "COLUMNS": "200",
    })
    return folder, env


def _trnf(kit: tuple[Path, dict[str, str]], *args: str) -> subprocess.CompletedProcess[str]:
    folder, env = kit
    return subprocess.run([sys.executable, "-m", "trnfrontier", "--prepare", "prepare.py", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_a_kit_without_a_step_log_header_trains_dry_runs_packages_and_verifies(kit: tuple[Path, dict[str, str]]) -> None:
    folder, _ = kit
    run = _trnf(kit, "train", "--train-py", "train.py", "--out", "runs/r1", "--timeout", "600")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    summary = json.loads((folder / "runs" / "r1" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["problems"] == [] and summary["steps"] == 10
    assert summary["step_log_start"]["source"] == "trnf's launch of the run (the log has no header line)"
    assert summary["step_log"] == "JSON lines (step, time); start time from trnf's launch of the run (the log has no header line)"
    assert summary["accounting"].startswith("the documented formula")
    assert 0 <= summary["charged_seconds"] < summary["startup_seconds"] + 600
    assert "budget from" in run.stdout and "start time from trnf's launch" in run.stdout
    assert "never called" not in run.stdout + run.stderr

    dry = _trnf(kit, "train", "--train-py", "train.py", "--dry-run", "--steps", "2")
    assert dry.returncode == 0, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "never called" not in dry.stdout + dry.stderr and "step log recorded 2 steps" in dry.stdout

    package = _trnf(kit, "package", "--train-py", "train.py", "--run-dir", "runs/r1", "-o", "submission.tar")
    assert package.returncode == 0, package.stderr[-3000:]
    verify = _trnf(kit, "verify", "submission.tar", "--json")
    report = json.loads(verify.stdout)
    (budget,) = [c for c in report["checks"] if c["name"] == "budget"]
    assert budget["verdict"] == "pass", budget
    assert "start time from trnf's launch of the run (the log has no header line) (as summary.json records it)" in budget["reason"]
    assert verify.returncode == 0, [c for c in report["checks"] if c["verdict"] == "fail"]


# nanochat's progress line, no JSON, as a kit's record_step_boundary might append it.
NANOCHAT_RECORD = '''_T0 = [time.time(), time.time()]


def record_step_boundary(step):
    """nanochat's printed progress line: the step, its dt, the total time in minutes."""
    path = os.environ.get("NEURON_COMPETITION_R1_STEP_LOG")
    if path and get_dist_info()[1] == 0:
        now, dt = time.time(), time.time() - _T0[1]
        _T0[1] = now
        with open(path, "a") as handle:
            handle.write(f"step {int(step):05d}/00010 ({step * 10:.2f}%) | loss: 3.2 | lrm: 1.00 | dt: {dt * 1000:.2f}ms | "
                         f"tok/sec: 12,345 | mfu: 10.1 | total time: {(now - _T0[0]) / 60:.2f}m\\n")
'''


@pytest.mark.slow
def test_a_kit_printing_nanochats_progress_lines_to_its_step_log_trains_and_packages(kit: tuple[Path, dict[str, str]]) -> None:
    folder, env = kit
    printed = folder.parent / "printed_kit"
    shutil.copytree(folder, printed, ignore=shutil.ignore_patterns("runs", "out", "*.tar", "__pycache__"))
    source = (printed / "prepare.py").read_text()
    start, end = source.index("def record_step_boundary"), source.index("@torch.no_grad()", source.index("def record_step_boundary"))
    (printed / "prepare.py").write_text(source[:start] + NANOCHAT_RECORD + "\n\n" + source[end:])
    run = _trnf((printed, env), "train", "--train-py", "train.py", "--out", "runs/r1", "--timeout", "600")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    summary = json.loads((printed / "runs" / "r1" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["problems"] == [] and summary["steps"] == 10
    assert summary["step_log"].startswith("printed step lines (step, elapsed seconds); start time from trnf's launch")
    assert "lower bound" not in run.stdout + run.stderr
    package = _trnf((printed, env), "package", "--train-py", "train.py", "--run-dir", "runs/r1", "-o", "submission.tar")
    assert package.returncode == 0, package.stderr[-3000:]
