"""Load a recipe from YAML, apply ``key.path=value`` overrides, validate, and explain errors.

Overrides are parsed as YAML scalars (``0.03`` is a float, ``true`` a bool, ``[0.9, 0.95]``
a list) and validated exactly like the file, so a typo in a key path or a wrong type is
reported with the path, before any compute is spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.recipes.schema import Recipe
from trnfrontier.suggest import did_you_mean


def parse_overrides(items: list[str]) -> list[tuple[list[str], Any]]:
    """``["optim.matrix_lr=0.03"]`` -> ``[(["optim", "matrix_lr"], 0.03)]``."""
    parsed: list[tuple[list[str], Any]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise UsageError(f"override {item!r} is not of the form key.path=value (e.g. optim.matrix_lr=0.03)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        parsed.append((key.split("."), value))
    return parsed


def _check_path(model: type[BaseModel], path: list[str]) -> None:
    """Refuse an override whose key path names no field (with the nearest valid names)."""
    current: Any = model
    for depth, part in enumerate(path):
        fields = getattr(current, "model_fields", None)
        if fields is None:
            raise UsageError(f"override key {'.'.join(path)!r}: {'.'.join(path[:depth])!r} is a value, not a section")
        if part not in fields:
            known = ", ".join(sorted(fields))
            where = ".".join(path[:depth]) or "the recipe"
            raise UsageError(
                f"override key {'.'.join(path)!r}: {where} has no field {part!r}"
                f"{did_you_mean(part, fields)} (known: {known})"
            )
        annotation = fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def apply_overrides(data: dict[str, Any], overrides: list[tuple[list[str], Any]]) -> dict[str, Any]:
    """Return a copy of ``data`` with each override set at its key path."""
    result = yaml.safe_load(yaml.safe_dump(data)) if data else {}
    for path, value in overrides:
        _check_path(Recipe, path)
        node = result
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
    return result


def format_validation_error(error: ValidationError, source: str) -> str:
    """One line per problem, each naming the key path: ``optim.matrix_lr: ...``."""
    lines = []
    for problem in error.errors():
        path = ".".join(str(part) for part in problem["loc"]) or "(recipe)"
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            near = did_you_mean(str(problem["loc"][-1]), _fields_at(problem["loc"][:-1]))
            message = f"unknown key{near} (`trnf recipes schema` lists every key)"
        lines.append(f"{path}: {message}")
    return f"{source}: invalid recipe: " + "; ".join(lines)


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the recipe section at ``loc`` (empty when it is not a section)."""
    current: Any = Recipe
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return []
        current = fields[part].annotation
    return list(getattr(current, "model_fields", None) or [])


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last,
    so `matrix_lr` written twice would silently train with the second value)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` keys may be overridden: only keys written here count
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one section", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_recipe_file(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise TrnfError(f"recipe {path} is a directory; give a recipe YAML file or a shipped name", exit_code=2)
    if not path.is_file():
        from trnfrontier.recipes.registry import shipped_recipes

        near = did_you_mean(path.name.removesuffix(".yaml"), shipped_recipes())
        raise TrnfError(
            f"recipe {path} not found{near}; `trnf recipes list` shows the shipped ones", exit_code=2
        )
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise TrnfError(f"recipe {path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}", exit_code=2) from None
    except UnicodeDecodeError:
        raise TrnfError(f"recipe {path} is not UTF-8 text", exit_code=2) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TrnfError(f"recipe {path} must be a YAML mapping of sections, not {type(data).__name__}", exit_code=2)
    data.setdefault("name", path.stem)
    return data


def validate_recipe(data: dict[str, Any], source: str) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise TrnfError(format_validation_error(exc, source), exit_code=2) from None


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, override and validate a recipe; every failure is a one-line TrnfError."""
    from trnfrontier.recipes.registry import resolve_recipe_path

    resolved = resolve_recipe_path(path)
    data = apply_overrides(read_recipe_file(resolved), parse_overrides(overrides or []))
    return validate_recipe(data, str(path))
