"""The dry run's kit environment (kit/harness.kit_dry_run_env): what it forwards and what it sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from trnfrontier.contract.kit import (
    COMPILE_ENV,
    ENV_PREFIX,
    EVAL_PUBLIC_ENV,
    NUM_STEPS_ENV,
    OUT_DIR_ENV,
    STEP_LOG_ENV,
)
from trnfrontier.kit.harness import kit_dry_run_env, logged_boundaries
from trnfrontier.runtime.rundir import STEP_LOG_FILE


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


# ---------------------------------------------------------------------------- the dry run's step log (issue 25.2)


@pytest.mark.parametrize("content,why", [
    (None, "no step log at {log}: train.py never called prepare.record_step_boundary()"),
    ("--- done ---\n", "the step log could not be read: step log {log} is in a form trnf does not read (line 1 is neither"),
    ('{"header": true, "start_time": 1.0}\n', "the step log {log} records no step"),
])
def test_a_log_with_no_boundary_says_why_in_the_readers_words(tmp_path: Path, content: str | None, why: str) -> None:
    log = tmp_path / STEP_LOG_FILE
    if content is not None:
        log.write_text(content)
    boundaries, said = logged_boundaries(tmp_path)
    assert boundaries == () and said.startswith(why.format(log=log))


def test_a_link_for_a_log_could_not_be_read(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.jsonl").write_text('{"step": 0, "time": 1.0}\n')
    (tmp_path / STEP_LOG_FILE).symlink_to(tmp_path / "elsewhere.jsonl")
    boundaries, why = logged_boundaries(tmp_path)
    assert boundaries == () and why.startswith("the step log could not be read: ") and "symbolic link" in why


def test_a_log_without_a_header_gives_its_boundaries(tmp_path: Path) -> None:
    (tmp_path / STEP_LOG_FILE).write_text('[default0]:{"step": 0, "time": 5.0}\n{"step": 1, "time": 6.0}\n')
    assert logged_boundaries(tmp_path) == (((0, 5.0), (1, 6.0)), "")
