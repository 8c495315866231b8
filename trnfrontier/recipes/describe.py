"""What a validated recipe amounts to: its parameter count, its resolved YAML, its schema."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from trnfrontier.errors import TrnfError
from trnfrontier.recipes.schema import Recipe

# Channels of the value-embedding gate's input (trnfrontier.runtime.model.VE_GATE_CHANNELS);
# tests/recipes/test_param_count.py holds the two equal.
VE_GATE_CHANNELS = 32


def count_params(recipe: Recipe) -> int:
    """Parameters of the recipe's model, from its shapes alone.

    Arithmetic rather than building the model: `trnf recipes list|show|validate` must not
    import torch (seconds of startup). tests/recipes/test_param_count.py checks this count
    against ``GPT.num_params()`` for every shape option, so the two cannot drift apart."""
    m = recipe.model
    width = m.resolved_n_embd()
    n_head = m.n_head if m.n_head is not None else width // m.head_dim
    n_kv = m.n_kv_head if m.n_kv_head is not None else n_head
    kv_dim = n_kv * m.head_dim
    attention = width * (n_head * m.head_dim) + 2 * width * kv_dim + width * width
    mlp = 2 * width * (m.mlp_ratio * width)
    # Alternate layers carry a value embedding (and its gate), always including the last.
    value_layers = (
        sum(1 for i in range(m.depth) if i % 2 == (m.depth - 1) % 2) if m.value_embeds else 0
    )
    gate = min(VE_GATE_CHANNELS, width) * n_kv
    embeddings = 2 * m.vocab_size * width  # token embedding + untied lm head
    return embeddings + m.depth * (attention + mlp) + value_layers * (m.vocab_size * kv_dim + gate)


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
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only folder: nothing was written there to remove
        raise TrnfError(f"--output {path}: cannot write it ({exc.strerror or exc})") from None
