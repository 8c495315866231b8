"""`trnf prepare` (not built yet: issue #2)."""

from __future__ import annotations

from trnfrontier.errors import not_built


def command() -> None:
    """Not built yet (issue #2)."""
    raise not_built("prepare", 2)
