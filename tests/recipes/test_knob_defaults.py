"""One definition per knob: the runtime specs hold every default, the schema takes them.

A default written twice drifts (the schema once said 300 Muon momentum warm-up steps where
the optimizer builder assumed 0). These tests hold every field of every section equal
between ``recipes/schema.py`` and ``runtime/recipe.py``, and show that the schema refuses
to be given a default, a field or a type of its own.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

import pytest
from pydantic import BaseModel

from trnfrontier.recipes import schema
from trnfrontier.recipes.schema import Recipe, Section, knob
from trnfrontier.runtime import recipe as spec
from trnfrontier.runtime.recipe import ResolvedRecipe


def _sections() -> list[tuple[str, type[BaseModel], type]]:
    """(name, schema section, runtime spec) for every section of a recipe."""
    hints = typing.get_type_hints(ResolvedRecipe)
    found = []
    for name, field in Recipe.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found.append((name, field.annotation, hints[name]))
    return found


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


def test_every_section_of_the_recipe_has_a_runtime_spec() -> None:
    sections = _sections()
    assert [name for name, _, _ in sections] == [
        "model", "optim", "schedule", "data", "budget", "runtime", "eval", "kernels", "run"
    ]
    for name, _section, spec_cls in sections:
        assert dataclasses.is_dataclass(spec_cls), name


@pytest.mark.parametrize(("name", "section", "spec_cls"), _sections(), ids=[s[0] for s in _sections()])
def test_schema_and_runtime_defaults_agree_on_every_field(name: str, section: type[BaseModel], spec_cls: type) -> None:
    from_schema = section().model_dump(mode="json")
    from_runtime = _plain(dataclasses.asdict(spec_cls()))
    # Same fields, in the same order (the order recipe.json and `trnf recipes show` print)...
    assert list(from_schema) == list(from_runtime), name
    # ... and the same default for each, value and type (1800.0 is not 1800).
    for field, value in from_runtime.items():
        assert from_schema[field] == value and type(from_schema[field]) is type(value), f"{name}.{field}"


@pytest.mark.parametrize(("name", "section", "spec_cls"), _sections(), ids=[s[0] for s in _sections()])
def test_every_default_is_within_the_schemas_own_bounds(name: str, section: type[BaseModel], spec_cls: type) -> None:
    # pydantic does not validate defaults; a default outside its bounds would be a recipe
    # that trnf refuses when a user writes the default out.
    defaults = section().model_dump()
    assert section.model_validate(defaults).model_dump() == defaults, name


def test_the_default_recipe_is_the_runtime_specs_defaults() -> None:
    resolved = Recipe(name="x").resolved()
    for name, _section, spec_cls in _sections():
        assert getattr(resolved, name) == spec_cls(), name


def test_the_muon_momentum_warmup_default_is_the_one_trnf_train_has_always_used() -> None:
    # The drift this file exists for: `trnf train` (the schema) warmed Muon's momentum up
    # over 300 steps while optim.build_optimizers assumed 0 for a section without the key.
    assert spec.OptimSpec().muon_momentum_warmup_steps == 300
    assert Recipe(name="x").optim.muon_momentum_warmup_steps == 300


def test_a_section_cannot_write_a_default_of_its_own() -> None:
    with pytest.raises(TypeError, match=r"declare it with knob\(\.\.\.\); its default is RunSpec's"):

        class Run(Section, spec=spec.RunSpec):
            max_loss: float = 30.0


def test_a_section_cannot_add_a_field_the_runtime_lacks() -> None:
    with pytest.raises(TypeError, match=r"max_los is not a field of RunSpec: add the knob there first"):

        class Run(Section, spec=spec.RunSpec):
            max_los: float = knob(gt=0)


def test_a_section_cannot_retype_a_knob() -> None:
    with pytest.raises(TypeError, match=r"Run\.max_loss: .*int.* is not RunSpec's type .*float"):

        class Run(Section, spec=spec.RunSpec):
            max_loss: int = knob(gt=0)


def test_a_knob_without_bounds_takes_the_runtime_type_and_is_still_validated() -> None:
    # nesterov is declared only in runtime/recipe.py: the schema still knows and checks it.
    assert schema.OptimSection.model_fields["nesterov"].annotation is bool
    with pytest.raises(ValueError, match="nesterov"):
        schema.OptimSection(nesterov="yes")  # type: ignore[arg-type]


def test_the_phase_default_is_one_constant_on_both_sides() -> None:
    # recipe.json leaves the default phase out; the schema, the runtime and the contract
    # must agree on which phase that is, or a Phase 1 run would read back as another.
    from trnfrontier.contract.phases import DEFAULT_PHASE, PHASES

    assert Recipe.model_fields["phase"].default == spec.DEFAULT_PHASE == DEFAULT_PHASE
    assert ResolvedRecipe.__dataclass_fields__["phase"].default == DEFAULT_PHASE
    assert "phase" not in Recipe(name="x").model_dump(mode="json")
    assert Recipe(name="x").resolved().to_dict() == Recipe(name="x").model_dump(mode="json")
    for number in PHASES:  # every phase the contract knows is one the runtime reads back
        assert ResolvedRecipe.from_dict({**Recipe(name="x").model_dump(mode="json"), "phase": number}).phase == number


def test_the_eval_defaults_are_the_trusted_prepares() -> None:
    # EvalSpec restates the contract's public evaluation (the runtime imports no prepare.py
    # at import time); this holds the copy to the trusted file's constants.
    import inspect

    import prepare
    from trnfrontier.evaluate.library import DEFAULT_BATCH_SIZE

    default = spec.EvalSpec()
    assert default.tokens == prepare.EVAL_TOKENS_PUBLIC
    assert default.seq_len == prepare.EVAL_SEQ_LEN
    assert default.batch_size == inspect.signature(prepare.eval_public).parameters["batch_size"].default
    assert DEFAULT_BATCH_SIZE == default.batch_size  # `trnf eval`'s default when nothing is recorded
