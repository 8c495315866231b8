"""What of torchrun's console reaches the terminal while a kit run goes on.

Everything torchrun prints is kept in ``logs/console.log`` and each rank's output in
``logs/rank<R>.std{out,err}.log``; the terminal gets what a person follows live (the
script's own lines: progress, its `---` block) and not what those logs hold for later:
a rank's Python traceback (from "Traceback (most recent call last):" to the exception
line, chained ones included), torchrun's own traceback and failure report, and its
``W1201 12:00:00.000 ...`` log lines. When the run fails, trnf ends with one line naming
the exception and the log that holds the traceback.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
# torchrun's agent logs through glog-style lines: W1201 23:43:16.758000 9336 torch/...
_AGENT_LOG = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d")
_RULE = re.compile(r"^={20,}$")
# torchrun --tee's "[default1]:", and torch's own "[rank1]: " before a rank's stderr lines.
_PREFIXES = re.compile(r"^(?:\[(?:default|rank)?\d+\]:\s?)+")


class ConsoleView:
    """Call with each console line; passes on the ones a person follows live to ``show``."""

    def __init__(self, show: Callable[[str], None]) -> None:
        self.show = show
        self.in_traceback: set[str] = set()  # the sources ("[default0]:", "" for torchrun) inside one
        self.in_report = False  # torchrun's failure report, between two rules of "="
        self.after_traceback: set[str] = set()  # sources whose traceback just ended

    def __call__(self, line: str) -> None:
        if self.in_report or _RULE.match(line.strip()):  # its "[1]:" lines are no rank's
            self.in_report = not (self.in_report and _RULE.match(line.strip()))
            return
        prefix_match = _PREFIXES.match(line)
        text = line[prefix_match.end():] if prefix_match else line
        source = prefix_match.group(0).replace(" ", "") if prefix_match else ""  # one key per rank
        if not source and _AGENT_LOG.match(text):
            return
        if text.startswith(_TRACEBACK):
            self.in_traceback.add(source)
            return
        if source in self.in_traceback:
            indented = text[:1].isspace() or not text.strip()
            if not indented:
                self.in_traceback.discard(source)  # the exception line ends it (shown at the end, once)
                self.after_traceback.add(source)
            return
        if source in self.after_traceback and (not text.strip() or text.startswith(_CHAINED)):
            return  # what separates the tracebacks of a chained exception
        self.after_traceback.discard(source)
        self.show(line)
