"""Recipes: the shipped ones validate, overrides are typed, and every error names its key path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.recipes.describe import count_params, json_schema, resolved, resolved_yaml
from trnfrontier.recipes.loading import load_recipe, parse_overrides
from trnfrontier.recipes.registry import shipped_recipes

REPO = Path(__file__).resolve().parents[2]
# The sections the issue asks of every recipe (plus `run`).
SECTIONS = ("model", "optim", "schedule", "data", "budget", "runtime", "eval", "kernels", "run")


@pytest.mark.parametrize("name", ["cpu_smoke", "baseline_d10", "muon_gqa", "tinyshakespeare"])
def test_shipped_recipes_validate(name: str) -> None:
    assert name in shipped_recipes()
    recipe = load_recipe(REPO / "recipes" / f"{name}.yaml")
    assert recipe.name == name
    assert count_params(recipe) > 0


def test_baseline_d10_is_the_kits_59_6m_parameter_model() -> None:
    recipe = load_recipe("baseline_d10")
    assert round(count_params(recipe) / 1e6, 1) == 59.6
    assert recipe.model.depth == 10 and recipe.model.resolved_n_embd() == 640
    assert recipe.eval.seq_len == 1024
    assert recipe.budget.seconds == 1800


def test_muon_gqa_uses_grouped_query_attention() -> None:
    recipe = load_recipe("muon_gqa")
    assert (
        recipe.model.n_kv_head is not None
        and recipe.model.n_kv_head < recipe.model.resolved_n_embd() // recipe.model.head_dim
    )


def test_overrides_are_typed_like_yaml() -> None:
    parsed = dict(
        (".".join(k), v)
        for k, v in parse_overrides(
            [
                "optim.matrix_lr=0.03",
                "runtime.compile=true",
                "optim.adam_betas=[0.9, 0.95]",
                "schedule.total_steps=null",
                "runtime.device=cpu",
            ]
        )
    )
    assert parsed == {
        "optim.matrix_lr": 0.03,
        "runtime.compile": True,
        "optim.adam_betas": [0.9, 0.95],
        "schedule.total_steps": None,
        "runtime.device": "cpu",
    }
    recipe = load_recipe(
        "cpu_smoke", ["optim.matrix_lr=0.03", "optim.adam_betas=[0.9, 0.99]", "budget.seconds=60"]
    )
    assert (
        recipe.optim.matrix_lr == 0.03
        and recipe.optim.adam_betas == (0.9, 0.99)
        and recipe.budget.seconds == 60
    )


@pytest.mark.parametrize(
    "override, path",
    [
        ("optim.matrix_lrr=0.1", "optim.matrix_lrr"),  # typo in a key
        ("optimizer.lr=0.1", "optimizer.lr"),  # unknown section
        ("optim.matrix_lr.x=1", "optim.matrix_lr"),  # a value is not a section
    ],
)
def test_unknown_override_keys_name_the_path(override: str, path: str) -> None:
    with pytest.raises(UsageError) as info:
        load_recipe("cpu_smoke", [override])
    assert path in str(info.value) and info.value.exit_code == 2


@pytest.mark.parametrize(
    "override, path",
    [
        ("optim.matrix_lr=-0.01", "optim.matrix_lr"),  # out of range
        ("optim.matrix_lr=fast", "optim.matrix_lr"),  # wrong type
        ("data.batch_size=0", "data.batch_size"),
        ("runtime.device=tpu", "runtime.device"),
        (
            "data.total_batch_tokens=1000",
            "data.total_batch_tokens",
        ),  # not a multiple of the micro-batch
        ("budget.seconds=2400", "1800"),  # over the competition budget
        ("schedule.mode=steps", "total_steps"),
    ],
)
def test_invalid_values_name_the_path(override: str, path: str) -> None:
    with pytest.raises(TrnfError) as info:
        load_recipe("cpu_smoke", [override])
    message = str(info.value)
    assert path in message and info.value.exit_code == 2
    assert "\n" not in message


def test_batch_must_divide_by_world_size() -> None:
    # 16 rows x 256 tokens x 3 processes does not divide 2 x 16 x 256.
    with pytest.raises(TrnfError, match="data.total_batch_tokens"):
        load_recipe("cpu_smoke", ["data.total_batch_tokens=8192", "runtime.nproc=3"])
    assert (
        load_recipe(
            "cpu_smoke", ["data.total_batch_tokens=8192", "runtime.nproc=2"]
        ).grad_accum_steps()
        == 1
    )


def test_non_competition_budget_is_allowed() -> None:
    assert (
        load_recipe("cpu_smoke", ["budget.seconds=2400", "budget.competition=false"]).budget.seconds
        == 2400
    )


def test_unknown_key_in_a_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\noptim:\n  matrix_lr: 0.02\n  muon_lr: 0.1\n")
    with pytest.raises(TrnfError) as info:
        load_recipe(path)
    assert "optim.muon_lr" in str(info.value) and "unknown key" in str(info.value)


def test_broken_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\nmodel:\n  depth: [1,\n")
    with pytest.raises(TrnfError, match="line"):
        load_recipe(path)


def test_missing_recipe_is_a_clear_error() -> None:
    with pytest.raises(TrnfError, match="not found"):
        load_recipe("no_such_recipe")


def test_a_key_written_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text("name: x\noptim:\n  matrix_lr: 0.02\n  matrix_lr: 0.03\n")
    with pytest.raises(TrnfError) as info:
        load_recipe(path)
    assert info.value.exit_code == 2
    assert "line 4" in str(info.value) and "'matrix_lr' appears twice" in str(info.value)
    # A YAML merge key may still be overridden: only keys written in one mapping count.
    merged = tmp_path / "merged.yaml"
    merged.write_text("name: x\nmodel:\n  <<: {depth: 2, n_embd: 128, head_dim: 32}\n  depth: 3\n")
    assert load_recipe(merged).model.depth == 3


def test_a_directory_is_not_a_recipe(tmp_path: Path) -> None:
    with pytest.raises(TrnfError, match="is a directory") as info:
        load_recipe(tmp_path)
    assert info.value.exit_code == 2


def test_resolved_recipe_is_plain_data_with_every_key() -> None:
    data = resolved(load_recipe("cpu_smoke"))
    assert json.loads(json.dumps(data)) == data
    for section in SECTIONS:
        assert isinstance(data[section], dict)
    assert "total_steps" in data["schedule"] and data["schedule"]["total_steps"] is None
    assert "name: cpu_smoke" in resolved_yaml(load_recipe("cpu_smoke"))


def test_json_schema_describes_every_section() -> None:
    schema = json.loads(json_schema())
    assert set(schema["properties"]) >= set(SECTIONS)
    assert schema["additionalProperties"] is False


def test_kernel_choices_survive_yaml_booleans(tmp_path: Path) -> None:
    """YAML 1.1 reads bare on/off as booleans; a kernels section means the words."""
    path = tmp_path / "k.yaml"
    path.write_text("name: k\nkernels:\n  relu2: on\n  rmsnorm: off\n  attention: auto\n")
    recipe = load_recipe(path, ["kernels.cross_entropy=on"])
    assert recipe.kernels.relu2 == "on" and recipe.kernels.rmsnorm == "off"
    assert recipe.kernels.attention == "auto" and recipe.kernels.cross_entropy == "on"
