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
  ...`` (also ``step 12/100``, ``name: value``, ``name=value``), with a unit after a value
  (``ms``, ``s``, ``m``/``min``, ``h``; none is seconds), as nanochat's ``step 00010/01000
  (1.00%) | loss: 3.2 | dt: 930.12ms | ... | total time: 0.16m``;
- either of these behind torchrun's ``[default0]:`` prefix.

When the step ended, by name: an absolute time in seconds since the epoch (``time``,
``timestamp``, ``wall_time``, ``t``), seconds since the process started (``elapsed``,
``elapsed_seconds``, ``elapsed_time``, ``total_time``), or the step's own duration (``dt``,
``step_time``, ``step_seconds``), the first found in that order. A ``_`` in a name is also
read as a space, a JSON key may carry its unit (``dt_ms``, ``elapsed_s``), and a name
inside a longer one is not it (the ``time`` of ``total time`` is not an absolute time).
Anything else is refused, naming why: a value that is not a finite number, a negative or
non-integer step index, a line that is none of the above. ``steplog`` turns records into
a run's boundaries.
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
    ("elapsed", ("elapsed", "elapsed_seconds", "elapsed_time", "total_time")),
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
# Seconds in one of each unit a printed time may carry (none: seconds).
UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "secs": 1.0, "seconds": 1.0,
         "m": 60.0, "min": 60.0, "mins": 60.0, "minutes": 60.0, "h": 3600.0, "hr": 3600.0, "hours": 3600.0}
_UNIT = "|".join(sorted(UNITS, key=len, reverse=True))
_TEXT_WHEN = {
    name: re.compile(
        rf"(?<![\w/]){re.escape(name).replace('_', '[ _]')}\s*[:=]?\s*({_NUMBER})\s*({_UNIT})?(?![\w/])", re.IGNORECASE
    )
    for _, names in WHEN_NAMES
    for name in names
}
# The word before a name that makes it part of a longer one ("total time", "step dt"),
# unless that word is a value ("loss nan time 3").
_WORD_BEFORE = re.compile(r"([a-z]+)[ _]$", re.IGNORECASE)
_VALUE_WORDS = {"nan", "inf", "infinity"}


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
    printed: bool = False  # from a printed "step N | ..." line, not JSON


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


def _scaled(value: object, scale: float, name: str) -> float:
    """``value`` in units of ``scale`` seconds, as seconds (held to ``_seconds``'s bounds both ways)."""
    return _seconds(_seconds(value, name) * scale, name)


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
    keys = {str(key).strip().lower().replace(" ", "_"): value for key, value in record.items()}
    for when, names in WHEN_NAMES:
        for name in names:
            for suffix, scale in (("", 1.0), *((f"_{unit}", UNITS[unit]) for unit in UNITS)):
                if name + suffix in keys:
                    label = "time" if when == "time" else name + suffix
                    return Record(step, when, _scaled(keys[name + suffix], scale, label))
    raise LineError(f"records step {step} but not when it ended (a time, elapsed seconds or dt)")


def _text_when(rest: str, name: str) -> float | None:
    """The seconds ``name`` says on the rest of a printed step line, or None: its first
    use that is not the tail of a longer name ("time" in "total time: 0.16m")."""
    for found in _TEXT_WHEN[name].finditer(rest):
        before = _WORD_BEFORE.search(rest, 0, found.start())
        if before is not None and before.group(1).lower() not in _VALUE_WORDS:
            continue
        return _scaled(float(found.group(1)), UNITS[(found.group(2) or "s").lower()], name)
    return None


def _text_line(text: str) -> Record:
    match = STEP_LINE.match(text)
    if match is None:
        raise LineError(f'{_SHAPE} nor a "step N | ... | dt 0.9s" line')
    step = _step(int(match.group(1)))
    rest = text[match.end():]
    for when, names in WHEN_NAMES:
        for name in names:
            seconds = _text_when(rest, name)
            if seconds is not None:
                return Record(step, when, seconds, printed=True)
    raise LineError(f"records step {step} but not when it ended (time, elapsed or dt)")


def parse_line(text: str) -> Header | Record | None:
    """The header or step record on ``text``; None for a blank line; LineError otherwise."""
    text = TEE_PREFIX.sub("", text.strip(), count=1).strip()
    if not text:
        return None
    if text[0] in "{[":
        try:
            record = json.loads(text)
        except (ValueError, RecursionError):
            raise LineError(_SHAPE) from None
        return _json_line(record)
    return _text_line(text)
