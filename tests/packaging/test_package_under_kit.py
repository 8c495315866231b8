"""A submission trnf packages (both forms) trains and scores under the organisers' kit.

The stub prepare.py of tests/fixtures/kit has only the contract's surface: no
resume_state, rank or world_size in make_dataloader, no EVAL_SEQ_LEN, no budget_accounting,
its own data root and step log. The packaged train.py must run beside it with nothing of
trnf installed in its way, record 0-based step boundaries in the official step log, write
out/final.pt, and the stub's own eval-public must score that checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.kit.stub_kit import KIT_DIR, make_kit_cache
from trnfrontier.packaging.build import package_run

STEPS = 2


@pytest.fixture(scope="module")
def kit_cache(tmp_path_factory: pytest.TempPathFactory, prepare_module) -> Path:
    return make_kit_cache(tmp_path_factory.mktemp("kit_cache"), prepare_module)


def _kit_env(cache: Path, step_log: Path) -> dict[str, str]:
    drop = ("TRNF_", "NEURON_COMPETITION_R1_", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({"NEURON_COMPETITION_R1_CACHE_DIR": str(cache), "NEURON_COMPETITION_R1_STEP_LOG": str(step_log),
                "TRNF_DRY_RUN_STEPS": str(STEPS), "TRNF_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "TRNF_COMPILE": "0"})
    return env


@pytest.mark.slow
@pytest.mark.parametrize("single_file", [True, False], ids=["single-file", "package"])
def test_packaged_submission_trains_and_scores_under_the_kit(tiny_run: Path, kit_cache: Path, tmp_path: Path,
                                                             single_file: bool) -> None:
    archive = tmp_path / "submission.tar"
    # force: the point here is the kit, not the gate (which may refuse for other reasons).
    package_run(tiny_run, archive, single_file=single_file, force=True)
    team = tmp_path / "team"
    with tarfile.open(archive) as tar:
        tar.extractall(team, filter="data")
    (team / "prepare.py").write_bytes((KIT_DIR / "prepare.py").read_bytes())  # the organisers' file beside it
    (team / "artifacts").mkdir()
    (team / "artifacts" / "tokenizer.zip").write_bytes((KIT_DIR / "artifacts" / "tokenizer.zip").read_bytes())
    step_log = tmp_path / "official_steps.jsonl"
    env = _kit_env(kit_cache, step_log)

    trained = subprocess.run([sys.executable, "train.py"], cwd=team, env=env, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = [json.loads(line) for line in step_log.read_text().splitlines()]
    assert [r["step"] for r in records if "step" in r] == list(range(STEPS))  # the kit's 0-based indexes
    assert (team / "out" / "final.pt").is_file()

    scored = subprocess.run([sys.executable, "prepare.py", "eval-public", "--train-py", "train.py", "--checkpoint", "out/final.pt",
                             "--eval-tokens", "1024", "--seq-len", "32", "--batch-size", "8"],
                            cwd=team, env=env, capture_output=True, text=True, timeout=600)
    assert scored.returncode == 0, scored.stderr[-3000:]
    result = json.loads(scored.stdout)
    assert math.isfinite(result["val_bpb"]) and result["num_tokens"] == 1024
