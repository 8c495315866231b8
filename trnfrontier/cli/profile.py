"""`trnf profile` (not built yet: issue #4)."""

from __future__ import annotations

from trnfrontier.errors import not_built


def command() -> None:
    """Not built yet (issue #4)."""
    raise not_built("profile", 4)
