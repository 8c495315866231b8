"""`trnf train` (not built yet: issue #3)."""

from __future__ import annotations

from trnfrontier.errors import not_built


def command() -> None:
    """Not built yet (issue #3)."""
    raise not_built("train", 3)
