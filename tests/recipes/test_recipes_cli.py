"""`trnf recipes list|show|validate|schema` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.cli_run import run_cli

REPO = Path(__file__).resolve().parents[2]


def test_list_json(capsys) -> None:
    code, out, _ = run_cli(["recipes", "list", "--json"], capsys)
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert set(rows) >= {"cpu_smoke", "baseline_d10", "muon_gqa"}
    assert round(rows["baseline_d10"]["params"] / 1e6, 1) == 59.6


def test_list_table(capsys) -> None:
    code, out, _ = run_cli(["recipes", "list"], capsys)
    assert code == 0 and "baseline_d10" in out and "59.6M" in out


def test_show_resolves_with_overrides(capsys) -> None:
    code, out, _ = run_cli(
        ["recipes", "show", "cpu_smoke", "optim.matrix_lr=0.05", "budget.seconds=60"], capsys
    )
    assert code == 0
    data = yaml.safe_load(out)
    assert data["optim"]["matrix_lr"] == 0.05 and data["budget"]["seconds"] == 60
    assert data["schedule"]["total_steps"] is None  # defaults are filled in


def test_show_json(capsys) -> None:
    code, out, _ = run_cli(
        ["recipes", "show", str(REPO / "recipes" / "muon_gqa.yaml"), "--json"], capsys
    )
    assert code == 0 and json.loads(out)["model"]["n_kv_head"] == 2


def test_show_bad_override_is_one_line(capsys) -> None:
    code, out, err = run_cli(["recipes", "show", "cpu_smoke", "optim.matrix_lr=-1"], capsys)
    assert code == 2 and out == ""
    assert "optim.matrix_lr" in err and err.count("\n") == 1 and "Traceback" not in err


def test_validate_reports_each_recipe(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel:\n  depht: 4\n")
    code, out, err = run_cli(["recipes", "validate", "cpu_smoke", str(bad)], capsys)
    assert code == 2
    assert "ok" in out and "cpu_smoke" in out
    assert "model.depht" in err


def test_validate_json_with_overrides(capsys) -> None:
    code, out, _ = run_cli(
        ["recipes", "validate", "cpu_smoke", "baseline_d10", "runtime.nproc=1", "--json"], capsys
    )
    assert code == 0
    results = json.loads(out)
    assert [r["valid"] for r in results] == [True, True]


def test_schema_is_json_schema(capsys, tmp_path: Path) -> None:
    code, out, _ = run_cli(["recipes", "schema"], capsys)
    assert code == 0
    schema = json.loads(out)
    assert "optim" in schema["properties"]
    target = tmp_path / "schema.json"
    code, _, _ = run_cli(["recipes", "schema", "-o", str(target)], capsys)
    assert code == 0 and json.loads(target.read_text()) == schema


def test_schema_to_an_unwritable_place_is_one_line(capsys, tmp_path: Path) -> None:
    code, _, err = run_cli(["recipes", "schema", "-o", str(tmp_path)], capsys)
    assert code == 2 and err.strip() == f"trnf: error: --output {tmp_path}: is a directory; give a file name (e.g. recipe.schema.json)"
    code, _, err = run_cli(["recipes", "schema", "-o", str(tmp_path / "missing" / "schema.json")], capsys)
    assert code == 1 and err.count("\n") == 1 and "cannot write it" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_show_with_an_override_missing_its_value_says_how_overrides_look(capsys) -> None:
    code, _, err = run_cli(["recipes", "show", "cpu_smoke", "optim.matrix_lr"], capsys)
    assert code == 2 and err.count("\n") == 1 and "key.path=value" in err
