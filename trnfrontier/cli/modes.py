"""Which options belong to recipe mode and which to kit mode (``--train-py``), declared once.

``trnf train`` and ``trnf package`` each run in one of two modes: a recipe / run directory
trnf owns, or a team's own train.py. An option of the other mode is a usage error (exit 2)
with the sentence below, checked before any work starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from trnfrontier.errors import UsageError

Mode = Literal["recipe", "kit"]


@dataclass(frozen=True)
class OnlyIn:
    option: str  # as the user types it (the key of ``given``)
    mode: Mode  # the one mode it applies to
    refusal: str  # what to say when it is given in the other mode


_TRAIN_KIT_ONLY = "{option} applies to --train-py runs; a recipe run's limits are budget.seconds and budget.max_steps"
_TRAIN_RECIPE_ONLY = "--train-py runs a script as the organisers do; --resume and --name are for recipe runs"
_PACKAGE_KIT_ONLY = "{option} is for kit mode (--train-py); a run directory brings its own"

TRAIN = (
    OnlyIn("--resume", "recipe", _TRAIN_RECIPE_ONLY),
    OnlyIn("--name", "recipe", _TRAIN_RECIPE_ONLY),
    OnlyIn("--timeout", "kit", _TRAIN_KIT_ONLY),
    OnlyIn("--dry-run", "kit", _TRAIN_KIT_ONLY),
    OnlyIn("--steps", "kit", _TRAIN_KIT_ONLY),
    OnlyIn("--phase", "kit", "--phase applies to --train-py runs; a recipe names its own (phase: 2, or the override phase=2)"),
)

PACKAGE = (
    OnlyIn("RUN_DIR", "recipe", "give RUN_DIR or --train-py, not both (a kit-mode run directory goes in --run-dir)"),
    OnlyIn("--single-file", "recipe", "--single-file applies to a run directory; with --train-py your file ships as it is"),
    OnlyIn("--checkpoint", "kit", _PACKAGE_KIT_ONLY),
    OnlyIn("--launch", "kit", _PACKAGE_KIT_ONLY),
    OnlyIn("--run-dir", "kit", _PACKAGE_KIT_ONLY),
    OnlyIn("--phase", "kit", "--phase is for kit mode (--train-py); a run directory's recipe says its phase"),
    OnlyIn(
        "--val-bpb-from-eval",
        "kit",
        "--val-bpb-from-eval is for kit mode (--train-py); a run directory's summary has its val_bpb",
    ),
)


def check_mode(rules: tuple[OnlyIn, ...], mode: Mode, given: Mapping[str, bool]) -> None:
    """Refuse (UsageError) the first option in ``given`` that belongs to the other mode."""
    for rule in rules:
        if rule.mode != mode and given.get(rule.option):
            raise UsageError(rule.refusal.format(option=rule.option))
