"""Every trnf command on a kit that has only the organisers' surface (tests/fixtures/kit).

The stub prepare.py has exactly docs/kit-contract.md's names (test_kit_surface.py proves it), so
what passes here needs nothing of trnf's own prepare.py: `trnf --prepare STUB` train
--train-py (0-based step counting, the kit's knobs forwarded), eval --train-py (and the
agreement with the stub's own eval-public to 1e-6), package --train-py (steps, charged
seconds and the public score from the kit's log and `---` block), verify --rerun-eval
--dry-run on that archive, and train --train-py --dry-run (stopped by the kit's own
NEURON_COMPETITION_R1_NUM_STEPS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.stub_kit import copy_kit, make_kit_cache

STEPS, EVAL_TOKENS = 8, 2048


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory, prepare_module) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kit")
    return {"kit": copy_kit(root / "team"), "cache": make_kit_cache(root / "cache", prepare_module), "root": root}


def _env(kit: dict[str, Path], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_COMPETITION_R1_", "TRNF_PREPARE"))}
    env.update({"NEURON_COMPETITION_R1_CACHE_DIR": str(kit["cache"]), "OMP_NUM_THREADS": "1", **extra})
    return env


def _trnf(kit: dict[str, Path], *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "trnfrontier", "--prepare", str(kit["kit"] / "prepare.py"), *args]
    return subprocess.run(command, cwd=kit["kit"], env=_env(kit, **extra), capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_train_eval_package_and_verify_a_kit_run(kit: dict[str, Path]) -> None:
    run_dir = kit["root"] / "run"
    knobs = {"NEURON_COMPETITION_R1_NUM_STEPS": str(STEPS), "NEURON_COMPETITION_R1_EVAL_TOKENS": str(EVAL_TOKENS)}
    trained = _trnf(kit, "train", "--train-py", "train.py", "--out", str(run_dir), "--json", **knobs)
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads(trained.stdout)
    # The kit records indexes 0..7: eight steps, not seven; the log proves the budget.
    assert summary["steps"] == STEPS and summary["problems"] == []
    assert summary["charged_seconds"] is not None and summary["over_budget"] is False
    assert summary["kit_summary"]["num_steps"] == STEPS and summary["kit_env"]["NEURON_COMPETITION_R1_NUM_STEPS"] == str(STEPS)
    printed = summary["kit_summary"]["public_val_bpb"]
    assert summary["reported_val_bpb"] == printed

    # trnf eval and the stub's own eval-public score the checkpoint alike (to 1e-6).
    checkpoint = Path(summary["final_checkpoint"])  # the run's own: NEURON_COMPETITION_R1_OUT_DIR
    assert checkpoint == run_dir / "out" / "final.pt" and summary["out_dir_ignored"] is False
    scored = _trnf(kit, "eval", "--train-py", "train.py", "--checkpoint", str(checkpoint), "--tokens", str(EVAL_TOKENS),
                   "--seq-len", "64", "--batch-size", "4", "--json")
    assert scored.returncode == 0, scored.stderr[-3000:]
    [result] = json.loads(scored.stdout)["results"]
    assert result["status"] == "ok" and result["num_tokens"] == EVAL_TOKENS
    assert result["tokenizer_sha256"] == summary["tokenizer_sha256"] is not None  # the kit's pinned artifact
    public = subprocess.run([sys.executable, "prepare.py", "eval-public", "--train-py", "train.py", "--checkpoint", str(checkpoint),
                             "--eval-tokens", str(EVAL_TOKENS), "--seq-len", "64", "--batch-size", "4"],
                            cwd=kit["kit"], env=_env(kit), capture_output=True, text=True, timeout=600)
    assert public.returncode == 0, public.stderr[-3000:]
    theirs = json.loads(public.stdout)
    assert abs(result["val_bpb"] - theirs["val_bpb"]) <= 1e-6
    assert abs(theirs["val_bpb"] - printed) <= 1e-6  # the in-process eval of train.py: the same rows

    archive = kit["root"] / "submission.tar"
    packaged = _trnf(kit, "package", "--train-py", "train.py", "--run-dir", str(run_dir), "-o", str(archive), "--json")
    assert packaged.returncode == 0, packaged.stderr[-3000:]
    claimed = json.loads(packaged.stdout)["claimed"]
    assert claimed["val_bpb"] == printed and claimed["eval_tokens"] == EVAL_TOKENS and claimed["eval_seq_len"] == 64

    verified = _trnf(kit, "verify", str(archive), "--rerun-eval", "--dry-run", "--json", "--eval-tokens", str(EVAL_TOKENS), "--eval-seq-len", "64")
    checks = {c["name"]: c for c in json.loads(verified.stdout)["checks"]}
    assert verified.returncode == 0, [c for c in checks.values() if c["verdict"] != "pass"]
    assert checks["budget"]["verdict"] == "pass" and f"{STEPS} steps" in checks["budget"]["reason"]
    assert checks["rerun-eval"]["verdict"] == "pass" and checks["dry-run"]["verdict"] == "pass"


@pytest.mark.slow
def test_kit_dry_run_stops_with_the_kits_own_knob(kit: dict[str, Path]) -> None:
    work = kit["root"] / "dry"
    done = _trnf(kit, "train", "--train-py", "train.py", "--dry-run", "--steps", "2", "--out", str(work), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    stages = {s["name"]: s for s in json.loads(done.stdout)["stages"]}
    assert all(s["passed"] for s in stages.values())
    assert "step log recorded 2 steps" in stages["steps"]["detail"]


MAKE_CHECKPOINT = """
import torch, train
config = train.ModelConfig(vocab_size=8192)
torch.manual_seed(0)
model = train.TinyLM(config)
torch.save({"model_state": model.state_dict(), "model_config": vars(config), "meta": {}}, "final.pt")
"""


def test_a_rejection_by_their_prepare_py_is_named_as_theirs(tmp_path: Path, prepare_module) -> None:
    """Their causality_check refuses the call: trnf eval says prepare.py rejected it, not that the model failed."""
    team = copy_kit(tmp_path / "team")
    cache = make_kit_cache(tmp_path / "cache", prepare_module)
    source = (team / "prepare.py").read_text()
    refusing = source.replace(
        "def causality_check(model, tokenizer, batch_size, seq_len, device):\n",
        "def causality_check(model, tokenizer, batch_size, seq_len, device):\n"
        "    raise ValueError(f'batch_size {batch_size} is below the 64 this checker needs')\n",
    )
    assert refusing != source
    (team / "prepare.py").write_text(refusing)
    kit = {"kit": team, "cache": cache, "root": tmp_path}
    made = subprocess.run([sys.executable, "-c", MAKE_CHECKPOINT], cwd=team, env=_env(kit), capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    done = _trnf(kit, "eval", "--train-py", "train.py", "--checkpoint", "final.pt", "--tokens", "256", "--seq-len", "32",
                 "--batch-size", "4")
    assert done.returncode == 1
    [line] = [x for x in done.stderr.splitlines() if x.startswith("trnf: error:")]
    assert f"prepare.py ({team / 'prepare.py'}) rejected the call causality_check(TinyLM, Tokenizer, 4, 32, " in line
    assert "below the 64 this checker needs" in line and "the model failed" not in line
