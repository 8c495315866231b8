"""The environment of spawned processes carries the data home, set or default."""

from __future__ import annotations

from pathlib import Path

import pytest

from trnfrontier.child_env import child_env, data_env, data_home, diagnostics_env
from trnfrontier.kit.harness import clean_environ


def test_the_default_data_home_is_written_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TRNF_HOME", raising=False)
    monkeypatch.delenv("TRNF_DATASET", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert data_home() == tmp_path / "user" / ".cache" / "trnfrontier"
    assert data_env()["TRNF_HOME"] == str(tmp_path / "user" / ".cache" / "trnfrontier")
    assert "TRNF_DATASET" not in data_env()


def test_a_set_home_dataset_and_prepare_are_forwarded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("TRNF_DATASET", "sample")
    monkeypatch.setenv("TRNF_PREPARE", str(tmp_path / "prepare.py"))
    env = child_env({"PATH": "/bin", "TRNF_DATASET": "other"})
    assert env["TRNF_HOME"] == str(tmp_path / "h") and env["PATH"] == "/bin"
    assert env["TRNF_DATASET"] == "other"  # what the caller sets wins
    assert env["TRNF_PREPARE"] == str(tmp_path / "prepare.py")


def test_the_dry_runs_clean_environment_finds_the_users_default_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The clean environment replaces HOME; with TRNF_HOME unset, prepare.py inside it looked
    for data under the temporary home and the README's dry runs failed on a default install."""
    monkeypatch.delenv("TRNF_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    env = clean_environ(tmp_path / "work" / "home", 1, 2, 3, tmp_path / "work" / "run")
    assert env["HOME"] == str(tmp_path / "work" / "home")
    assert env["TRNF_HOME"] == str(tmp_path / "user" / ".cache" / "trnfrontier")


def test_the_organisers_variables_are_forwarded(tmp_path) -> None:
    environ = {"NEURON_COMPETITION_R1_CACHE_DIR": str(tmp_path / "kit"), "NEURON_COMPETITION_R1_NUM_STEPS": "3",
               "TRNF_HOME": str(tmp_path / "trnf"), "UNRELATED": "x"}
    env = data_env(environ)
    assert env["NEURON_COMPETITION_R1_CACHE_DIR"] == str(tmp_path / "kit") and env["NEURON_COMPETITION_R1_NUM_STEPS"] == "3"
    assert env["TRNF_HOME"] == str((tmp_path / "kit").resolve())  # the kit's data root wins, as in prepare.py
    assert "UNRELATED" not in env



def test_the_dry_run_forwards_the_kits_knobs_and_stops_it_with_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NEURON_COMPETITION_R1_CACHE_DIR", str(tmp_path / "kit"))
    monkeypatch.setenv("NEURON_COMPETITION_R1_EVAL_TOKENS", "4096")
    monkeypatch.setenv("NEURON_COMPETITION_R1_API_TOKEN", "sk-do-not-leak")  # the prefix, not one of the kit's knobs
    env = clean_environ(tmp_path / "work" / "home", 1, 2, 3, tmp_path / "work" / "run")
    assert "NEURON_COMPETITION_R1_API_TOKEN" not in env and "sk-do-not-leak" not in " ".join(env.values())
    assert env["NEURON_COMPETITION_R1_CACHE_DIR"] == str(tmp_path / "kit")  # where the kit's prepare.py finds its data
    assert env["NEURON_COMPETITION_R1_NUM_STEPS"] == "3"  # the kit's own step knob stops it
    assert env["NEURON_COMPETITION_R1_EVAL_PUBLIC"] == "0" and env["NEURON_COMPETITION_R1_EVAL_TOKENS"] == "4096"
    assert env["NEURON_COMPETITION_R1_STEP_LOG"] == str(tmp_path / "work" / "run" / "step_boundaries.jsonl")


def test_every_child_starts_with_faulthandler_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A fatal signal in a rank then leaves each thread's Python stack in its log (how an abort
    in interpreter shutdown is told from a crash: kit.logs.aborted_after_finishing)."""
    monkeypatch.delenv("PYTHONFAULTHANDLER", raising=False)
    assert child_env({"PATH": "/bin"})["PYTHONFAULTHANDLER"] == "1"
    assert clean_environ(tmp_path / "home", 2, 2, 3, tmp_path / "run")["PYTHONFAULTHANDLER"] == "1"
    assert diagnostics_env() == {"PYTHONFAULTHANDLER": "1"}
    assert child_env({"PYTHONFAULTHANDLER": ""})["PYTHONFAULTHANDLER"] == ""  # what the caller sets wins
    monkeypatch.setenv("PYTHONFAULTHANDLER", "")
    assert diagnostics_env() == {}
