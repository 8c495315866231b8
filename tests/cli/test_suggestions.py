"""Did-you-mean for recipe names and keys; help that shows flags as flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_run import run_cli
from trnfrontier.recipes.loading import did_you_mean


def test_did_you_mean() -> None:
    assert did_you_mean("cpu_smok", ["cpu_smoke", "muon_gqa"]) == " (did you mean 'cpu_smoke'?)"
    assert did_you_mean("zzz", ["cpu_smoke"]) == ""


def test_a_misspelt_recipe_name_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["recipes", "show", "cpu_smok"], capsys)
    assert code == 2
    assert "did you mean 'cpu_smoke'?" in err and err.count("\n") == 1


def test_a_misspelt_override_key_gets_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["recipes", "show", "cpu_smoke", "optim.matrx_lr=0.03"], capsys)
    assert code == 2 and "did you mean 'matrix_lr'?" in err


def test_a_misspelt_key_in_a_file_gets_a_suggestion(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nmodel:\n  dept: 3\n", encoding="utf-8")
    code, _, err = run_cli(["recipes", "validate", str(recipe)], capsys)
    assert code == 2 and "model.dept: unknown key (did you mean 'depth'?)" in err


@pytest.mark.parametrize("argv", [["train", "--help"], ["package", "--help"], ["recipes", "list", "--help"]])
def test_help_shows_boolean_flags_without_a_value(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    code, out, _ = run_cli(argv, capsys)
    assert code == 0
    assert "--json" in out
    assert "<bool>" not in out
