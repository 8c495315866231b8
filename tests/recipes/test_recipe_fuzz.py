"""Malformed recipes end in the tool's one-line error, never a traceback or a silent coercion.

The named cases are the faults found by hand (deep nesting, a list as a key, a 5,000-digit
integer, `yes` read as 1.0, `.inf`, an empty file); the hypothesis tests throw random
mutations of a real recipe, random YAML-ish text and random overrides at the loader.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_run import run_cli
from trnfrontier.errors import TrnfError
from trnfrontier.recipes.describe import resolved
from trnfrontier.recipes.loading import MAX_NESTING, load_recipe
from trnfrontier.recipes.schema import Recipe

REPO = Path(__file__).resolve().parents[2]
FUZZ = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NAMED_FAULTS = {
    "deep list": "name: x\nmodel: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep map": "name: x\nmodel: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "list key": "name: x\n? [a, b]\n: 1\n",
    "flow list key": "name: x\nmodel: {[1, 2]: 3}\n",
    "5000-digit integer": "name: x\nruntime:\n  seed: " + "9" * 5000 + "\n",
    "yes as a float": "name: x\noptim:\n  matrix_lr: yes\n",
    "infinite rope_base": "name: x\nmodel:\n  rope_base: .inf\n",
    "infinite grad_clip": "name: x\noptim:\n  grad_clip: .inf\n",
    "nan": "name: x\nrun:\n  max_loss: .nan\n",
    "string as an int": "name: x\nmodel:\n  depth: '10'\n",
    "float as an int": "name: x\nmodel:\n  depth: 10.0\n",
    "int as a bool": "name: x\nruntime:\n  compile: 1\n",
    "bad date": "name: x\ndescription: 2020-13-45\n",
    "bad explicit int": "name: x\nmodel:\n  depth: !!int ten\n",
    "seed past 64 bits": "name: x\nruntime:\n  seed: 99999999999999999999999\n",
    "empty": "",
    "only a comment": "# nothing here\n",
    "empty mapping": "{}\n",
}


def _write(directory: Path, text: str) -> Path:
    path = directory / "fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _load_or_one_line(source: str | Path, overrides: list[str] | None = None) -> Recipe | None:
    """The recipe, or None after checking the failure is a TrnfError of one line."""
    try:
        return load_recipe(source, overrides)
    except TrnfError as exc:
        assert "\n" not in str(exc) and str(exc)
        return None


@pytest.mark.parametrize("fault", sorted(NAMED_FAULTS))
def test_named_fault_is_one_line_through_the_cli(fault: str, tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, NAMED_FAULTS[fault])
    code, out, err = run_cli(["recipes", "show", str(path)], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err and str(path) in err


@pytest.mark.parametrize(
    "override",
    [
        "model.depth=" + "[" * 5000,
        "model.depth=" + "[" * (MAX_NESTING + 5) + "]" * (MAX_NESTING + 5),
        "runtime.seed=" + "9" * 5000,
        "optim.matrix_lr=yes",
        "optim.grad_clip=.inf",
        "model.rope_base=.inf",
        "model.depth='3'",
        "model.depth={[1]: 2}",
    ],
)
def test_bad_override_is_one_line_through_the_cli(override: str, capsys) -> None:
    code, out, err = run_cli(["recipes", "show", "cpu_smoke", override], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err and override.split("=")[0] in err


def test_errors_say_what_yaml_read() -> None:
    with pytest.raises(TrnfError, match=r"optim\.matrix_lr.*got true.*boolean"):
        load_recipe("cpu_smoke", ["optim.matrix_lr=yes"])
    with pytest.raises(TrnfError, match=r"model\.rope_base.*finite.*got inf"):
        load_recipe("cpu_smoke", ["model.rope_base=.inf"])


def test_legitimate_values_still_validate() -> None:
    """Strictness refuses coercions, not real values: an int where a float belongs is a
    number, a list is how YAML writes a pair, and nesting a few levels deep is fine."""
    recipe = load_recipe("cpu_smoke", ["optim.matrix_lr=1", "optim.adam_betas=[0.9, 0.99]"])
    assert recipe.optim.matrix_lr == 1.0 and recipe.optim.adam_betas == (0.9, 0.99)
    for name in ("cpu_smoke", "baseline_d10", "muon_gqa"):
        assert load_recipe(REPO / "recipes" / f"{name}.yaml").name == name


NASTY_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["yes", "no", "on", "off", ".inf", "-.inf", ".nan", "1e400", "0x1F", "1_000"]),
    st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(min_value=0, max_value=3), max_size=2),
)


def _leaf_paths(data: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            paths.extend(_leaf_paths(value, prefix + (key,)))
        paths.append(prefix + (key,))
    return paths


SMOKE = resolved(load_recipe("cpu_smoke"))
LEAVES = _leaf_paths(SMOKE)


@FUZZ
@given(path=st.sampled_from(LEAVES), value=NASTY_VALUES)
def test_fuzz_a_mutated_recipe_never_tracebacks(path: tuple[str, ...], value: Any) -> None:
    data = yaml.safe_load(yaml.safe_dump(SMOKE))
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    with tempfile.TemporaryDirectory() as directory:
        recipe = _load_or_one_line(_write(Path(directory), yaml.safe_dump(data)))
    if recipe is not None:  # what validated was never coerced from a string or a bool
        got = resolved(recipe)
        for part in path:
            got = got[part]
        if isinstance(value, str):
            assert isinstance(got, str)
        if isinstance(value, bool):  # a bool stays a bool, or a kernel's "on"/"off"
            assert isinstance(got, (bool, str))


YAML_BITS = st.sampled_from(
    [
        "name: x\n", "model:\n", "  depth: ", "optim:\n", "  matrix_lr: ", "budget:\n",
        "  seconds: ", "runtime:\n", "  seed: ", "[", "]", "{", "}", "? ", ": ", ", ", "\n",
        "- ", "&a ", "*a ", "!!int ", "!!float ", "!!binary ", "!!set ", "<<: ", "'", '"',
        "yes", ".inf", "9" * 60, "2020-13-45", "\t", "#", "---\n", "...\n", "%YAML 1.1\n",
    ]
)


@FUZZ
@given(bits=st.lists(st.one_of(YAML_BITS, st.text(max_size=4)), max_size=40))
def test_fuzz_random_yaml_never_tracebacks(bits: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        _load_or_one_line(_write(Path(directory), "".join(bits)))


@FUZZ
@given(
    key=st.one_of(
        st.sampled_from([".".join(p) for p in LEAVES]),
        st.text(alphabet="abcdefghijklmnopqrstuvwxyz._", max_size=12),
    ),
    raw=st.one_of(st.lists(YAML_BITS, max_size=12).map("".join), st.text(max_size=30)),
)
def test_fuzz_overrides_never_traceback(key: str, raw: str) -> None:
    _load_or_one_line("cpu_smoke", [f"{key}={raw}"])
