"""`trnf profile`'s command line, checked before anything is built: no torch here, so a
typo is refused in a moment (``measure`` imports torch and builds the model)."""

from __future__ import annotations

import typing
from pathlib import Path

from trnfrontier.errors import UsageError
from trnfrontier.runtime.recipe import DeviceName

if typing.TYPE_CHECKING:
    from trnfrontier.recipes.schema import Recipe

DEVICE_CHOICES: tuple[str, ...] = typing.get_args(DeviceName)


def check_options(device: str | None, trace: Path | None) -> None:
    """Command-line choices that cannot work, refused before a model is built (exit 2)."""
    if device is not None and device not in DEVICE_CHOICES:
        raise UsageError(f"--device {device}: unknown device; choose {', '.join(DEVICE_CHOICES)}")
    if trace is None:
        return
    if trace.is_dir():
        raise UsageError(f"--trace {trace}: is a directory; give the trace's file name (e.g. profile.json)")
    try:
        trace.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--trace {trace}: cannot create its folder {trace.parent} ({exc.strerror or exc})") from None


def split_arguments(extra: list[str], *, compare: bool, trace: Path | None) -> tuple[list[str], str | None]:
    """The words after RECIPE: ``key.path=value`` overrides, and with --compare the second
    recipe. Returns (overrides, second recipe or None); anything else is a usage error."""
    overrides = [a for a in extra if "=" in a and not a.startswith("-")]
    others = [a for a in extra if a not in overrides]
    unknown_options = [a for a in others if a.startswith("-")]
    if unknown_options:
        raise UsageError(f"unknown option {unknown_options[0]} for `trnf profile` (see trnf profile --help)")
    if not compare:
        if others:
            raise UsageError(f"unexpected argument {others[0]!r}: overrides are key.path=value; two recipes need --compare")
        return overrides, None
    if len(others) != 1:
        raise UsageError("--compare needs exactly two recipes: trnf profile --compare RECIPE_A RECIPE_B [key=value ...]")
    if trace is not None:
        raise UsageError("--trace profiles one recipe; drop it with --compare")
    return overrides, others[0]


def check_comparable(a: Recipe, b: Recipe) -> None:
    """``--compare`` times both recipes in one process, where the NKI kernel choice (the
    ops dispatch table) is process-wide: two recipes that choose differently are refused."""
    if a.kernels != b.kernels:
        raise UsageError(
            f"--compare times {a.name} and {b.name} in one process, where NKI kernels are chosen once for "
            "both; they set different kernels: profile each on its own"
        )
