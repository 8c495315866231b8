"""What a validated recipe amounts to: its parameter count, its resolved YAML, its schema."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from trnfrontier.errors import TrnfError
from trnfrontier.recipes.schema import Recipe


def count_params(recipe: Recipe) -> int:
    """Parameters of the recipe's model, counted on the meta device (no memory, no init cost)."""
    import torch

    from trnfrontier.runtime.model import GPT, GPTConfig

    config = GPTConfig.from_recipe(recipe.model.model_dump(mode="json"))
    with torch.device("meta"):
        return GPT(config).num_params()


def resolved(recipe: Recipe) -> dict[str, Any]:
    """The resolved recipe: every key present, plain data (what the runtime reads)."""
    return recipe.model_dump(mode="json")


def resolved_yaml(recipe: Recipe) -> str:
    return yaml.safe_dump(resolved(recipe), sort_keys=False, default_flow_style=False)


def json_schema() -> str:
    """The recipe's JSON Schema (for editors: yaml-language-server, VS Code, ...)."""
    schema = Recipe.model_json_schema()
    schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    schema.setdefault("title", "trnf recipe")
    return json.dumps(schema, indent=2, sort_keys=False)


def write_json_schema(path: Path) -> None:
    """The schema into ``path``, whole or not at all (a temporary file beside it, then a rename)."""
    if path.is_dir():
        raise TrnfError(f"--output {path}: is a directory; give a file name (e.g. recipe.schema.json)", exit_code=2)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json_schema() + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TrnfError(f"--output {path}: cannot write it ({exc.strerror or exc})") from None
