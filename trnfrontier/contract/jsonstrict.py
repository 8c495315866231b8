"""JSON from an archive, read one way only: no duplicate keys, no NaN/Infinity, bounded depth and numbers.

Two JSON readers can disagree on ``{"params": 1, "params": 2}`` (first or last wins), so a
duplicate key is a rejection, not a choice. Deep nesting is refused with one clear
message instead of a RecursionError traceback. Every number is bounded before Python
converts it: an integer of 5,000 digits (which ``int()`` refuses with a ValueError), a
400-digit integer that overflows ``float()``, ``1e999`` (which parses as infinity) are each
refused with the field that holds them named (``claimed.val_bpb``, ``line 3, time``).

``check_jsonl`` applies the same reading to a JSON-lines file (a step log, a trainer log)
line by line, with a cap on each line, before any parser of the contract sees it.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64
# Integers up to 2**53 (exact as floats: seconds since 1970, token counts, parameter counts);
# floats finite and at most 1e18 in magnitude. Anything larger is not a value a run records.
MAX_INT_DIGITS = 16
MAX_FLOAT = 1e18
MAX_LINE_BYTES = 1 << 20
# Lines of one JSON-lines document: a step log records one per step, and a million steps in a
# 30-minute budget is one every 1.8 ms. More is a flood, refused before a line is parsed.
MAX_LINES = 1_000_000


class StrictJSONError(ValueError):
    """The document is refused; the message names it and why."""


class _Unbounded:
    """A number outside the bounds, kept as text until its place in the document is known."""

    def __init__(self, text: str, why: str) -> None:
        self.text, self.why = text, why


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


def _int(text: str) -> Any:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Unbounded(text, f"an integer of {digits:,} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> Any:
    if len(text) > 64:
        return _Unbounded(text, f"a number written with {len(text):,} characters")
    value = float(text)
    if not math.isfinite(value) or abs(value) > MAX_FLOAT:
        return _Unbounded(text, f"{text[:24]} (numbers must be finite and at most {MAX_FLOAT:g})")
    return value


def _first_unbounded(value: Any) -> tuple[str, _Unbounded] | None:
    """The path (``claimed.val_bpb``, ``files[2]``) and the first out-of-bounds number, iteratively."""
    todo: list[tuple[str, Any]] = [("", value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, _Unbounded):
            return path or "the document", item
        if isinstance(item, dict):
            todo.extend((f"{path}.{key}" if path else str(key), child) for key, child in reversed(list(item.items())))
        elif isinstance(item, list):
            todo.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
    return None


def depth(value: Any) -> int:
    """Nesting depth of a parsed document (iterative: a deep one cannot overflow the stack here)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            todo.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def strict_loads(data: bytes | str, *, what: str, max_depth: int = MAX_DEPTH, constants: bool = False) -> Any:
    """Parse ``data`` or raise StrictJSONError naming ``what`` and the problem. ``constants``: let
    NaN and Infinity through as floats (for a reader that names them in its own words)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, object_pairs_hook=_pairs(what), parse_constant=float if constants else _constant(what),
                           parse_int=_int, parse_float=_float)
    except StrictJSONError:
        raise
    except UnicodeDecodeError:
        raise StrictJSONError(f"{what} is not UTF-8 text") from None
    except RecursionError:
        raise StrictJSONError(f"{what} is nested too deeply (over {max_depth} levels)") from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(f"{what} is not valid JSON ({exc})") from None
    except ValueError as exc:  # anything json itself refuses on the way
        raise StrictJSONError(f"{what} is not valid JSON ({str(exc)[:80]})") from None
    if depth(value) > max_depth:
        raise StrictJSONError(f"{what} is nested too deeply (over {max_depth} levels)")
    bad = _first_unbounded(value)
    if bad is not None:
        path, number = bad
        raise StrictJSONError(f"{what}: field {path[:80]} is {number.why}")
    return value


def check_jsonl(data: bytes, *, what: str, max_line: int = MAX_LINE_BYTES, json_only: bool = True,
                constants: bool = False, keep: bool = True, max_lines: int = MAX_LINES) -> list[Any]:
    """Every non-blank line of a JSON-lines document, each read by ``strict_loads``; the error
    names the line (``what line 7: field time is ...``). ``json_only=False``: lines that do not
    start with ``{`` or ``[`` (a kit's progress lines) are left to the caller's parser, bounded
    in length only. ``keep=False``: check only, return nothing (memory stays one line's)."""
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    if lines > max_lines:
        raise StrictJSONError(f"{what} has {lines:,} lines (at most {max_lines:,}: a flood, not a run's log)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = data[: exc.start].count(b"\n") + 1
        raise StrictJSONError(f"{what} is not UTF-8 text (line {where})") from None
    records = []
    for index, line in enumerate(text.split("\n"), 1):
        if len(line) > max_line:
            raise StrictJSONError(f"{what} line {index} is {len(line):,} characters long (at most {max_line:,})")
        stripped = line.strip()
        if stripped and (json_only or stripped[0] in "{["):
            record = strict_loads(stripped, what=f"{what} line {index}", constants=constants)
            if keep:
                records.append(record)
    return records
