"""A Phase 2-style run on 4 gloo CPU ranks, through the commands a team uses: train (with the
sharded optimizer), a crash (kill -9) and --resume, the consolidated final checkpoint,
package with the server's launch, verify (inference.py consistent with load_for_eval),
CORE through inference.py, and the combined score against a pool.

Kept as small as the chain allows: a depth-1 model, 6 steps of 16 micro-batches (the
batch must divide across the 64 ranks the archive declares), a 4-item-per-task CORE.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runtime.test_trainer import TINY
from trnfrontier import processes
from trnfrontier.contract.launch import launch_line
from trnfrontier.runtime.checkpoint_ref import latest_checkpoint
from trnfrontier.runtime.safetensors_io import read_safetensors

REPO = Path(__file__).resolve().parents[2]
PHASE2 = [
    *TINY,
    "phase=2",
    "runtime.threads=1",
    "data.total_batch_tokens=8192",  # 4 x 32 tokens a rank: 16 micro-steps at 4 ranks, 1 at 64
    "budget.max_steps=6",
    "budget.seconds=900",
    "run.checkpoint_every_seconds=0.001",
]


def _trnf(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRNF_PREPARE": str(REPO / "prepare.py")}
    return subprocess.run([sys.executable, "-m", "trnfrontier", *args], env=env, capture_output=True, text=True, timeout=timeout)


def _train_then_crash(run: Path) -> None:
    """`trnf train` on 4 ranks, killed (-9, its whole process group) once step 3's checkpoint exists."""
    env = {**os.environ, "TRNF_PREPARE": str(REPO / "prepare.py")}
    command = [sys.executable, "-m", "trnfrontier", "train", "cpu_smoke", "--out", str(run), "--nproc", "4", *PHASE2]
    trnf = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    tree: set[processes.Proc] = set()
    try:
        deadline = time.monotonic() + 600
        while not (run / "checkpoints" / "step_000003").is_dir():
            assert trnf.poll() is None, trnf.stderr.read().decode()[-3000:] if trnf.stderr else ""
            assert time.monotonic() < deadline, "no step-3 checkpoint in time"
            time.sleep(0.1)
        tree = processes.descendants(trnf.pid)
        os.killpg(trnf.pid, signal.SIGKILL)
        trnf.wait()
    finally:
        processes.kill(tree | processes.descendants(trnf.pid))
    assert not (run / "final").exists()


@pytest.mark.slow
def test_phase2_run_trains_resumes_packages_verifies_and_scores(sample_home: Path, tmp_path: Path) -> None:
    run = tmp_path / "final-run"
    _train_then_crash(run)
    resumed = _trnf("train", "--resume", str(run))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 6 and summary["world_size"] == 4
    assert summary["resumed_from"] and summary["sharded_optimizer"] is True
    assert summary["budget_seconds"] == 900 and summary["val_bpb"] is not None
    # Consolidated by rank 0: one single-device state dict, every parameter whole.
    weights, _ = read_safetensors(run / "final" / "model.safetensors")
    assert weights["lm_head.weight"].shape == (8192, 64) and latest_checkpoint(run) is not None

    archive = tmp_path / "s.tar"
    packaged = _trnf("package", str(run), "-o", str(archive), "--launch", launch_line(64, 2), "--json")
    assert packaged.returncode == 0, packaged.stderr[-3000:]
    assert "inference.py" in json.loads(packaged.stdout)["members"]

    verified = _trnf("verify", str(archive), "--json")
    report = json.loads(verified.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert verified.returncode == 0 and report["ok"], [c for c in report["checks"] if not c["ok"]]
    assert checks["launch"]["reason"] == "LNC=2, nproc_per_node=64" and checks["inference"]["verdict"] == "pass"
    # The shipped format sample times the path at the launch's ranks but projects nothing
    # about the real bundle, so the check says so instead of passing.
    timing = checks["core-time"]
    assert timing["verdict"] == "skip" and not timing["required"], timing
    assert "not a projection" in timing["reason"] and "at 64 ranks" in timing["reason"] and "--core-bundle" in timing["reason"]

    scored = _trnf("eval", str(run), "--core", "--bundle", "sample", "--max-per-task", "4", "--json")
    assert scored.returncode == 0, scored.stderr[-3000:]
    core = json.loads(scored.stdout)["results"][0]["core"]
    assert core["through"].startswith("inference.py") and isinstance(core["core_metric"], float)

    pool = tmp_path / "pool.csv"
    pool.write_text("name,val_bpb,core\nteam-a,0.93,0.20\nteam-b,0.96,0.25\n")
    placed = _trnf("runs", "score", "--pool", str(pool), "--name", run.name, "--json")
    assert placed.returncode == 0, placed.stderr[-3000:]
    (mine,) = json.loads(placed.stdout)["runs"]
    assert mine["name"] == run.name and mine["of"] == 3 and mine["core"] == core["core_metric"]
