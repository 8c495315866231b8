"""One line of a step log, read: the one module to change when the organisers' real format
is known (KIT-CONTRACT.md: ``record_step_boundary`` appends to
``NEURON_COMPETITION_R1_STEP_LOG``; what it writes is not public).

A line is a header (a process's start time), a step record (a completed step's 0-based
index and when it ended), or blank. Understood:

- JSON, this project's prepare.py: ``{"header": true, "start_time": s, ...}`` and
  ``{"step": 12, "time": s}``;
- JSON of other shapes: ``{"step": 12, <when>: ...}`` with ``<when>`` one of the names
  below, and any other keys (loss, ...) ignored;
- text, the progress lines a kit train.py prints: ``step 00012 | loss 3.21 | dt 0.93s |
  ...`` (also ``step 12/100``, ``name: value``, ``name=value``), ``s`` or ``ms`` after a
  value.

When the step ended, by name: an absolute time in seconds since the epoch (``time``,
``timestamp``, ``wall_time``, ``t``), seconds since the process started (``elapsed``,
``elapsed_seconds``, ``total_time``), or the step's own duration (``dt``, ``step_time``,
``step_seconds``), the first found in that order. Anything else is refused, naming why:
a value that is not a finite number, a negative or non-integer step index, a line that is
none of the above. ``steplog`` turns records into a run's boundaries.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Literal

When = Literal["time", "elapsed", "dt"]
# (kind, names): which keys say when a step ended, in the order they are looked for.
WHEN_NAMES: tuple[tuple[When, tuple[str, ...]], ...] = (
    ("time", ("time", "timestamp", "wall_time", "t")),
    ("elapsed", ("elapsed", "elapsed_seconds", "total_time")),
    ("dt", ("dt", "step_time", "step_seconds")),
)
# A step index or a time beyond these is no step log's (and would overflow a float).
MAX_STEP = 10**9
MAX_SECONDS = 1e12

# A printed step line starts with the word "step" and its number ("step 12", "step:12/100",
# "step 00012/01000"); kit/logs.py reads the rest of such a line for loss, lr, tok/s, ...
STEP_LINE = re.compile(r"^\W*step\b[\s:=#]*(\d+)(?:\s*/\s*\d+)?", re.IGNORECASE)
# torchrun --tee puts "[default<rank>]:" before each line of a worker's output.
TEE_PREFIX = re.compile(r"^\[(?:default|rank)?\d+\]:")
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)\b"
_TEXT_WHEN = {
    name: re.compile(rf"(?<![\w/]){re.escape(name)}\s*[:=]?\s*({_NUMBER})\s*(ms|s)?(?![\w/])", re.IGNORECASE)
    for _, names in WHEN_NAMES
    for name in names
}


_SHAPE = 'is neither a header nor a step record {"step": int, "time": seconds}'


class LineError(ValueError):
    """Why a line is not a step-log line (``steplog`` adds its number)."""


@dataclass(frozen=True)
class Header:
    start: float  # the process's start, seconds since the epoch


@dataclass(frozen=True)
class Record:
    step: int  # the 0-based index of the step just completed
    when: When  # what ``value`` is: an absolute time, seconds since the start, or the step's duration
    value: float


def _show(value: object) -> str:
    """A value as a message quotes it: short, text in quotes (archive text is never echoed long)."""
    return (repr(value) if isinstance(value, str) else str(value))[:40]


def _seconds(value: object, name: str) -> float:
    """A finite, bounded number of seconds (bool, text and huge integers refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LineError(f"has {name} {_show(value)}, not a number of seconds")
    if isinstance(value, int) and abs(value) > MAX_SECONDS:
        raise LineError(f"has {name} {_show(value)}, beyond any clock")
    number = float(value)
    if not math.isfinite(number) or abs(number) > MAX_SECONDS:
        raise LineError(f"has a non-finite {name}" if not math.isfinite(number) else f"has {name} {number:g}, beyond any clock")
    if number < 0:
        raise LineError(f"has a negative {name} ({number:g} s)")
    return number


def _step(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEP:
        raise LineError(f"has step {_show(value)}, not a step index (an integer from 0)")
    return value


def _json_line(record: object) -> Header | Record:
    if not isinstance(record, dict):
        raise LineError(_SHAPE)
    if record.get("header") is True and "start_time" in record:
        return Header(_seconds(record["start_time"], "start time"))
    if "step" not in record:
        raise LineError(_SHAPE)
    step = _step(record["step"])
    for when, names in WHEN_NAMES:
        for name in names:
            if name in record:
                return Record(step, when, _seconds(record[name], "time" if when == "time" else name))
    raise LineError(f"records step {step} but not when it ended (a time, elapsed seconds or dt)")


def _text_line(text: str) -> Record:
    match = STEP_LINE.match(text)
    if match is None:
        raise LineError(f'{_SHAPE} nor a "step N | ... | dt 0.9s" line')
    step = _step(int(match.group(1)))
    rest = text[match.end():]
    for when, names in WHEN_NAMES:
        for name in names:
            found = _TEXT_WHEN[name].search(rest)
            if found:
                value = float(found.group(1)) / (1000.0 if (found.group(2) or "").lower() == "ms" else 1.0)
                return Record(step, when, _seconds(value, "time" if when == "time" else name))
    raise LineError(f"records step {step} but not when it ended (time, elapsed or dt)")


def parse_line(text: str) -> Header | Record | None:
    """The header or step record on ``text``; None for a blank line; LineError otherwise."""
    text = TEE_PREFIX.sub("", text.strip(), count=1)
    if not text:
        return None
    if text[0] in "{[":
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            raise LineError(_SHAPE) from None
        return _json_line(record)
    return _text_line(text)
