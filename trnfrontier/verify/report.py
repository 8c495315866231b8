"""Check and Report: what each verify step concluded, in one line, and the overall verdict."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# Terminal escape sequences (CSI, OSC ... ST/BEL, and two-byte ESC forms), dropped whole.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
MAX_REASON_CHARS = 400
MAX_NOTE_CHARS = 2000

Verdict = Literal["pass", "fail", "skip"]


def terminal_safe(text: object, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` as one plain line a terminal shows as it is: escape sequences dropped, every other
    control or invisible formatting character (bidi overrides, zero-width marks) shown as
    ``\\uXXXX``, whitespace runs made one space, at most ``limit`` characters. Archive text quoted
    in a reason (a file name, an exception, a line of train.py) goes through this first; rich
    markup in it is escaped where it is printed (``cli/verify.py``)."""
    cleaned = _ESCAPES.sub("", str(text))
    shown = "".join(ch if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf", "Co", "Cs") else f"\\u{ord(ch):04x}"
                    for ch in cleaned)
    line = " ".join(shown.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass(frozen=True)
class Check:
    """One named check: its verdict and one line of reason.

    ``required`` checks must pass for the archive to pass; an optional check (the
    tokenizer pin when no tokenizer is pinned) may skip without failing the run.
    """

    name: str
    verdict: Verdict
    reason: str
    required: bool = True

    def __post_init__(self) -> None:
        # One line, always: reasons often quote exceptions from hostile input.
        object.__setattr__(self, "reason", terminal_safe(self.reason, MAX_REASON_CHARS))

    @property
    def ok(self) -> bool:
        return self.verdict == "pass" or (not self.required and self.verdict == "skip")


def passed(name: str, reason: str) -> Check:
    return Check(name, "pass", reason)


def failed(name: str, reason: str) -> Check:
    return Check(name, "fail", reason)


def skipped(name: str, reason: str, *, required: bool = True) -> Check:
    return Check(name, "skip", reason, required)


@dataclass
class Report:
    """All checks of one verify run, in the order they ran."""

    archive: str
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The first line of every report: whether archive code ran sandboxed, unsandboxed, or not at all.
    sandbox: str = ""
    # `--core`: the CORE report of the archive's model (evaluate.core), when it ran.
    core: dict[str, Any] | None = None

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def note(self, text: str) -> None:
        self.notes.append(terminal_safe(text, MAX_NOTE_CHARS))

    def get(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "sandbox": self.sandbox,
            "archive": self.archive,
            "ok": self.ok,
            "checks": [asdict(c) | {"ok": c.ok} for c in self.checks],
            "notes": list(self.notes),
            **({"core": self.core} if self.core is not None else {}),
        }
