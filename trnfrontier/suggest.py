"""Did-you-mean: the nearest known names to a misspelt one."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` / `` (did you mean 'x' or 'y'?)`` for the close matches of
    ``word`` among ``known``, else an empty string (ready to append to a message)."""
    matches = difflib.get_close_matches(word, sorted(set(known)), n=2, cutoff=0.6)
    if not matches:
        return ""
    return " (did you mean " + " or ".join(repr(m) for m in matches) + "?)"
