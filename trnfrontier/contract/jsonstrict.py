"""JSON from an archive, read one way only: no duplicate keys, no NaN/Infinity, bounded depth.

Two JSON readers can disagree on ``{"params": 1, "params": 2}`` (first or last wins), so a
duplicate key is a rejection, not a choice. Deep nesting is refused with one clear
message instead of a RecursionError traceback.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64


class StrictJSONError(ValueError):
    """The document is refused; the message names it and why."""


def _pairs(what: str):  # noqa: ANN202 - a json object_pairs_hook
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise StrictJSONError(f"{what} has the key {key[:60]!r} twice (readers could disagree on its value)")
            seen[key] = value
        return seen

    return hook


def _constant(what: str):  # noqa: ANN202 - a json parse_constant hook
    def refuse(name: str) -> Any:
        raise StrictJSONError(f"{what} contains {name}, which is not JSON")

    return refuse


def depth(value: Any) -> int:
    """Nesting depth of a parsed document (iterative: a deep one cannot overflow the stack here)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            todo.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def strict_loads(data: bytes | str, *, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``data`` or raise StrictJSONError naming ``what`` and the problem."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, object_pairs_hook=_pairs(what), parse_constant=_constant(what))
    except StrictJSONError:
        raise
    except UnicodeDecodeError:
        raise StrictJSONError(f"{what} is not UTF-8 text") from None
    except RecursionError:
        raise StrictJSONError(f"{what} is nested too deeply (over {max_depth} levels)") from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(f"{what} is not valid JSON ({exc})") from None
    if depth(value) > max_depth:
        raise StrictJSONError(f"{what} is nested too deeply (over {max_depth} levels)")
    return value
