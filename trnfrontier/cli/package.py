"""`trnf package` (not built yet: issue #5)."""

from __future__ import annotations

from trnfrontier.errors import not_built


def command() -> None:
    """Not built yet (issue #5)."""
    raise not_built("package", 5)
