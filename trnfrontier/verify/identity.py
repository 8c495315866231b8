"""The scored model is the checkpoint's: what load_for_eval returned, tensor by tensor, against the checked checkpoint.

The checkpoint check proved ``model.safetensors`` and ``final.pt`` hold the same finite
tensors, dense (no slack bytes) and with metadata too small to carry weights. That proves
nothing about the model train.py builds from them: its ``load_for_eval`` could read weights
from anywhere it can reach. So the model server lists every tensor reachable from the
loaded model (``ServedModel.tensors``: parameters, buffers, attribute caches, the archive
modules' globals) with a SHA256 of its bytes, and this module compares that list with the
checkpoint:

- every parameter and persistent buffer must be a checkpoint tensor: same name (after the
  ``_orig_mod.`` / ``module.`` prefixes compile and DDP add) or, renamed, same contents;
  same shape; its bytes equal to the checkpoint tensor's cast to the model's dtype (a model
  may compute in another precision, never with other values);
- every other tensor (non-persistent buffers such as rotary tables, caches, globals) is
  derived: counted, named in the report, and refused over ``DERIVED_LIMIT`` elements in all
  (a rotary table of a 20,480-position context at head size 128 is 2.6M);
- a checkpoint tensor the model does not use is reported, not refused.

The list comes from the sandboxed process and a determined train.py could lie in it; the
functions that build it are bound before train.py is imported, so it must do so on purpose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnfrontier.untrusted.modelserver import tensor_digest

DERIVED_LIMIT = 1 << 22  # elements held outside the checkpoint, in all
_PREFIXES = ("_orig_mod.", "module.")
_DTYPES = {"float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
           "float8_e4m3fn", "float8_e5m2"}


def checkpoint_shapes(safetensors: Path) -> dict[str, list[int]]:
    """Tensor name -> shape of a (checked) safetensors file, from its header."""
    from safetensors import safe_open

    with safe_open(str(safetensors), framework="pt") as st:
        return {name: list(st.get_slice(name).get_shape()) for name in st.keys()}


def normal_name(name: str) -> str:
    """A parameter name without the prefixes torch.compile and DDP add (``_orig_mod.``, ``module.``)."""
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return name.replace("._orig_mod.", ".")


@dataclass
class Identity:
    """The verdict: why the served model is not the checkpoint's (``problems``), and what it holds besides."""

    problems: list[str] = field(default_factory=list)
    matched: int = 0
    derived: list[str] = field(default_factory=list)
    derived_elements: int = 0
    unused: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        extra = f"; {self.derived_elements:,} elements derived ({', '.join(self.derived[:3])}{' ...' if len(self.derived) > 3 else ''})" if self.derived else ""
        unused = f"; {len(self.unused)} checkpoint tensor(s) unused" if self.unused else ""
        return f"{self.matched} parameters and buffers are the checkpoint's tensors, value for value{extra}{unused}"


def _entries(report: dict[str, Any]) -> list[dict[str, Any]]:
    tensors = report.get("tensors")
    if not isinstance(tensors, list):
        raise ValueError("the tensor report has no list of tensors")
    out = []
    for item in tensors:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("kind"), str)
                and item.get("dtype") in _DTYPES and isinstance(item.get("sha256"), str) and isinstance(item.get("shape"), list)
                and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in item["shape"])):
            raise ValueError(f"the tensor report has a malformed entry ({str(item)[:80]})")
        out.append(item)
    return out


def compare(report: dict[str, Any], safetensors: Path) -> Identity:
    """The served model's tensors (``report``) against the checkpoint at ``safetensors``."""
    import torch
    from safetensors import safe_open

    verdict = Identity()
    try:
        entries = _entries(report)
    except ValueError as exc:
        verdict.problems.append(str(exc))
        return verdict
    used: set[str] = set()
    with safe_open(str(safetensors), framework="pt") as st:
        names = set(st.keys())
        digests: dict[tuple[str, str], str] = {}

        def digest(name: str, dtype: str) -> str:
            key = (name, dtype)
            if key not in digests:
                digests[key] = tensor_digest(st.get_tensor(name).to(getattr(torch, dtype)))
            return digests[key]

        by_content: dict[tuple[str, str, tuple[int, ...]], str] = {}
        for entry in entries:
            registered = entry["kind"] in ("parameter", "buffer")
            name = normal_name(entry["name"])
            if name in names and list(st.get_slice(name).get_shape()) == entry["shape"] and digest(name, entry["dtype"]) == entry["sha256"]:
                used.add(name)
                verdict.matched += registered
                continue
            if not by_content or (next(iter(by_content))[1] != entry["dtype"]):
                by_content = {(digest(n, entry["dtype"]), entry["dtype"], tuple(st.get_slice(n).get_shape())): n for n in names}
            twin = by_content.get((entry["sha256"], entry["dtype"], tuple(entry["shape"])))
            if twin is not None:
                used.add(twin)
                verdict.matched += registered
            elif registered:
                what = "holds other values than" if name in names else "is not in"
                verdict.problems.append(f"{entry['kind']} {entry['name'][:80]!r} ({entry['dtype']} {entry['shape']}) {what} the checkpoint: "
                                        "the model scored would not be the checkpoint's")
            else:
                verdict.derived.append(entry["name"][:60])
                verdict.derived_elements += math.prod(entry["shape"])
        verdict.unused = sorted(names - used)
    if verdict.derived_elements > DERIVED_LIMIT:
        verdict.problems.append(f"the model holds {verdict.derived_elements:,} elements in tensors that are not the checkpoint's "
                                f"({', '.join(verdict.derived[:3])}); at most {DERIVED_LIMIT:,} may be derived (rotary tables, masks)")
    return verdict
