"""The dry run's kit environment (kit/harness.kit_dry_run_env): what it forwards and what it sets."""

from __future__ import annotations

from pathlib import Path

from trnfrontier.contract.kit import (
    COMPILE_ENV,
    ENV_PREFIX,
    EVAL_PUBLIC_ENV,
    NUM_STEPS_ENV,
    OUT_DIR_ENV,
    STEP_LOG_ENV,
)
from trnfrontier.kit.harness import kit_dry_run_env


def test_the_teams_knobs_pass_but_not_its_output_folder_nor_other_variables(tmp_path: Path) -> None:
    parent = {
        EVAL_PUBLIC_ENV: "1",
        f"{ENV_PREFIX}EVAL_TOKENS": "4096",
        OUT_DIR_ENV: "/home/team/checkpoints",  # outside the dry run: its checkpoint must not go there
        f"{ENV_PREFIX}API_TOKEN": "secret",
        "HOME": "/home/team",
    }
    env = kit_dry_run_env(3, tmp_path / "steps.jsonl", parent)
    assert env == {
        EVAL_PUBLIC_ENV: "1",  # the team's choice stands
        f"{ENV_PREFIX}EVAL_TOKENS": "4096",
        NUM_STEPS_ENV: "3",
        COMPILE_ENV: "0",
        STEP_LOG_ENV: str(tmp_path / "steps.jsonl"),
    }
