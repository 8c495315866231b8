"""Load a recipe from YAML, apply ``key.path=value`` overrides, validate, and explain errors.

A misspelt name or key gets the nearest known ones (``did_you_mean``).

Overrides are parsed as YAML scalars (``0.03`` is a float, ``true`` a bool, ``[0.9, 0.95]``
a list) and validated exactly like the file, so a typo in a key path or a wrong type is
reported with the path, before any compute is spent.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.recipes.schema import Recipe


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` / `` (did you mean 'x' or 'y'?)`` for the close matches of
    ``word`` among ``known``, else an empty string (ready to append to a message)."""
    matches = difflib.get_close_matches(word, sorted(set(known)), n=2, cutoff=0.6)
    if not matches:
        return ""
    return " (did you mean " + " or ".join(repr(m) for m in matches) + "?)"


def parse_overrides(items: list[str]) -> list[tuple[list[str], Any]]:
    """``["optim.matrix_lr=0.03"]`` -> ``[(["optim", "matrix_lr"], 0.03)]``."""
    parsed: list[tuple[list[str], Any]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise UsageError(f"override {item!r} is not of the form key.path=value (e.g. optim.matrix_lr=0.03)")
        try:
            value = load_yaml(raw) if raw.strip() else ""
        except RecipeLimitError as exc:
            raise UsageError(f"override {key!r}: {exc.problem}") from None
        except yaml.YAMLError:
            value = raw  # not YAML: validation reports it as the plain string it is
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


def format_validation_error(
    error: ValidationError,
    source: str,
    model: type[BaseModel] = Recipe,
    what: str = "recipe",
    keys_hint: str = "`trnf recipes schema` lists every key",
) -> str:
    """One line per problem, each naming the key path: ``optim.matrix_lr: ...``. Any
    pydantic document with the recipe's conventions (a sweep spec) reads the same way."""
    lines = []
    for problem in error.errors():
        path = ".".join(_key(part) for part in problem["loc"]) or f"({what})"
        message = " ".join(problem["msg"].removeprefix("Value error, ").split())
        if problem["type"] == "extra_forbidden":
            near = did_you_mean(str(problem["loc"][-1]), _fields_at(problem["loc"][:-1], model))
            message = f"unknown key{near} ({keys_hint})"
        else:
            message += _given(problem.get("input"))
        lines.append(f"{path}: {message}")
    return f"{source}: invalid {what}: " + "; ".join(lines)


def _fields_at(loc: tuple[int | str, ...], model: type[BaseModel] = Recipe) -> list[str]:
    """The field names of the section at ``loc`` (empty when it is not a section)."""
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return []
        current = fields[part].annotation
    return list(getattr(current, "model_fields", None) or [])


# Limits on what a recipe's YAML may contain. A recipe is a few sections of scalars; these
# are far above any real one and far below what breaks the parser (Python's recursion
# limit, the 4,300-digit int conversion limit) or the runtime (64-bit seeds and counts).
MAX_NESTING = 32
MAX_INT_BITS = 64


def _key(part: object) -> str:
    """A key path part as written, or quoted where it is not a plain name (a newline in a
    key must not break the one-line error)."""
    text = str(part)
    return text if text.replace("_", "a").replace("-", "a").isalnum() else repr(part)


def _given(value: object) -> str:
    """`` (got ...)`` for a scalar input, so a strict-type error shows what YAML read."""
    if isinstance(value, bool):
        # YAML 1.1 reads yes/no/on/off as booleans: say so, it is rarely what was meant.
        return f" (got {str(value).lower()}: YAML reads yes/no/on/off/true/false as a boolean)"
    if isinstance(value, (int, float, str)) and len(repr(value)) <= 60:
        return f" (got {value!r})"
    return ""


class RecipeLimitError(yaml.YAMLError):
    """YAML that parses but exceeds a recipe limit (nesting depth, integer size)."""

    def __init__(self, message: str, mark: yaml.Mark | None) -> None:
        super().__init__(message)
        self.problem = message
        self.problem_mark = mark


class _RecipeLoader(yaml.SafeLoader):
    """SafeLoader with the recipe limits, hashable keys only, and no key given twice in one
    mapping (plain YAML keeps the last, so `matrix_lr` written twice would silently train
    with the second value)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        # The composer recurses once per level: count the levels instead of letting
        # `[[[[...` reach Python's recursion limit.
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                raise RecipeLimitError(f"nesting deeper than {MAX_NESTING} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = sum(ch.isdigit() for ch in str(node.value))
        if digits > 2 * MAX_INT_BITS:  # checked before int() converts thousands of digits
            raise RecipeLimitError(f"an integer of {digits} digits is larger than {MAX_INT_BITS} bits", node.start_mark)
        value = super().construct_yaml_int(node)
        if value.bit_length() >= MAX_INT_BITS:
            raise RecipeLimitError(f"integer {node.value} is larger than {MAX_INT_BITS} bits", node.start_mark)
        return value

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # A constructor that chokes on its scalar (`!!int x`, a date like 2020-13-45)
        # raises ValueError or TypeError; report it at the node's line like any YAML error.
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, ArithmeticError, LookupError) as exc:
            raise yaml.constructor.ConstructorError(None, None, f"cannot read {node.value!r}: {exc}"[:200], node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` keys may be overridden: only keys written here count
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"a {type(key).__name__} cannot be a key; keys are names", key_node.start_mark
                ) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one section", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_RecipeLoader.add_constructor("tag:yaml.org,2002:int", _RecipeLoader.construct_yaml_int)


def load_yaml(text: str) -> Any:
    """Parse recipe YAML (a file or one override value) with the recipe limits."""
    try:
        return yaml.load(text, Loader=_RecipeLoader)  # noqa: S506 - a SafeLoader
    except (ValueError, TypeError, ArithmeticError, LookupError) as exc:
        # PyYAML's deferred constructors (`!!set` on a scalar, say) fail outside
        # construct_object: still a YAML problem of the text, not a bug of the tool.
        raise yaml.constructor.ConstructorError(None, None, f"cannot read the YAML: {exc}"[:200]) from None


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
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        what = "exceeds a recipe limit" if isinstance(exc, RecipeLimitError) else "is not valid YAML"
        # One line: PyYAML's own str() spans several (the mark, a caret under the text).
        problem = " ".join(str(getattr(exc, "problem", None) or str(exc).splitlines()[0]).split())
        raise TrnfError(f"recipe {path} {what}{where}: {problem}", exit_code=2) from None
    except UnicodeDecodeError:
        raise TrnfError(f"recipe {path} is not UTF-8 text", exit_code=2) from None
    if data is None or data == {}:
        # An empty file would otherwise validate as the full default (1,800 s) recipe.
        raise TrnfError(
            f"recipe {path} is empty; write at least the sections you mean to set "
            "(`trnf recipes show cpu_smoke` prints a complete one)",
            exit_code=2,
        )
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
