"""The competition's phases as data: one typed record per phase, everything that differs.

``PHASES[1]`` is the qualifying round (one Trainium2 chip, 30 minutes, scored by val_bpb);
``PHASES[2]`` the final (a whole trn2.48xlarge, 4 hours, val_bpb and CORE half each).
Recipes choose ``phase: 1|2`` (default 1); the recipe schema takes the phase's budget, and
``trnf package`` / ``trnf verify`` check launch shapes, budget and the files a submission
carries against the phase an archive declares. Nothing else in trnf spells a phase's
numbers: a rule the organisers publish or change is one edit here.

What is known and what is inferred (``docs/phase2.md`` says why):

- Phase 1 is evidenced (``docs/kit-contract.md``): ``NEURON_LOGICAL_NC_CONFIG=<1|2> torchrun
  --standalone --nproc_per_node=<1|4|8> train.py``, any of those pairs; 1,800 s charged
  after 5 uncharged startup steps, at most 900 s of startup excluded.
- Phase 2's machine, hours and score are quoted from the kit README: 16 chips, 14,400 s,
  the whole server used, 50% val_bpb + 50% CORE each min-max normalised over the
  finalists, CORE within 60 minutes, an ``inference.py`` beside train.py.
- Inferred for Phase 2 (no public evidence): the launch shapes. A trn2.48xlarge is one
  node of 16 chips x 8 physical NeuronCores, so "the whole server" under the Phase 1
  launch grammar is one process per logical core: 64 processes at LNC 2, 128 at LNC 1,
  ``--standalone`` (one node; no multi-node rendezvous). The startup rules and step log
  are assumed to be Phase 1's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from trnfrontier.runtime.budget_rule import (
    BUDGET_SECONDS,
    STARTUP_CAP_SECONDS,
    STARTUP_STEPS_EXCLUDED,
)
from trnfrontier.runtime.recipe import DEFAULT_PHASE

# Per Trainium2 chip: 8 physical NeuronCore-v3; NEURON_LOGICAL_NC_CONFIG=2 pairs them (4 logical).
CORES_PER_CHIP = 8


@dataclass(frozen=True)
class Metric:
    """One term of a phase's score."""

    name: str  # the key runs and the ledger use: "val_bpb", "core"
    weight: float
    higher_is_better: bool


@dataclass(frozen=True)
class LaunchShape:
    lnc: int  # NEURON_LOGICAL_NC_CONFIG
    nproc: int  # torchrun --nproc_per_node


@dataclass(frozen=True)
class Phase:
    number: int
    instance: str
    chips: int
    launch_shapes: tuple[LaunchShape, ...]
    budget_seconds: float
    startup_steps_excluded: int
    startup_allowance_cap_seconds: float
    metrics: tuple[Metric, ...]
    # "min-max over the pool": each metric rescaled to [0, 1] across the finalists' entries
    # (best 1) before the weights apply; "none": the single metric is the score as it is.
    normalisation: str
    inference_py: bool  # the submission carries an inference.py the scorer runs CORE through
    core_timeout_seconds: float | None
    submissions_per_week: int
    inferred: tuple[str, ...]  # which of the facts above no public evidence shows

    @property
    def cores(self) -> int:
        """Physical NeuronCores of the whole machine."""
        return self.chips * CORES_PER_CHIP

    @property
    def lnc_choices(self) -> tuple[int, ...]:
        return tuple(sorted({s.lnc for s in self.launch_shapes}))

    @property
    def nproc_choices(self) -> tuple[int, ...]:
        return tuple(sorted({s.nproc for s in self.launch_shapes}))

    def accepts(self, lnc: int, nproc: int) -> bool:
        return LaunchShape(lnc, nproc) in self.launch_shapes

    def shapes_text(self) -> str:
        """``64 processes at LNC 2 or 128 at LNC 1``: the shapes as a message names them."""
        if self.launch_shapes == _product(self.lnc_choices, self.nproc_choices):
            return f"--nproc_per_node {_either(self.nproc_choices)} with LNC {_either(self.lnc_choices)}"
        parts = [f"--nproc_per_node={s.nproc} with LNC {s.lnc}" for s in self.launch_shapes]
        return _either(parts)

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)


def _product(lncs: tuple[int, ...], nprocs: tuple[int, ...]) -> tuple[LaunchShape, ...]:
    return tuple(LaunchShape(lnc, n) for lnc, n in itertools.product(lncs, nprocs))


def _either(items: tuple[object, ...] | list[str]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


VAL_BPB = "val_bpb"
CORE = "core"

PHASES: dict[int, Phase] = {
    1: Phase(
        number=1,
        instance="trn2.3xlarge",
        chips=1,
        launch_shapes=_product((1, 2), (1, 4, 8)),
        budget_seconds=BUDGET_SECONDS,
        startup_steps_excluded=STARTUP_STEPS_EXCLUDED,
        startup_allowance_cap_seconds=STARTUP_CAP_SECONDS,
        metrics=(Metric(VAL_BPB, 1.0, higher_is_better=False),),
        normalisation="none",
        inference_py=False,
        core_timeout_seconds=None,
        submissions_per_week=5,
        inferred=(),
    ),
    2: Phase(
        number=2,
        instance="trn2.48xlarge",
        chips=16,
        # The whole server, one process per logical NeuronCore: 16 x 4 at LNC 2, 16 x 8 at LNC 1.
        launch_shapes=(LaunchShape(2, 64), LaunchShape(1, 128)),
        budget_seconds=14_400.0,
        startup_steps_excluded=STARTUP_STEPS_EXCLUDED,
        startup_allowance_cap_seconds=STARTUP_CAP_SECONDS,
        metrics=(Metric(VAL_BPB, 0.5, higher_is_better=False), Metric(CORE, 0.5, higher_is_better=True)),
        normalisation="min-max over the pool",
        inference_py=True,
        core_timeout_seconds=3_600.0,
        submissions_per_week=3,
        inferred=(
            "launch_shapes",
            "startup_steps_excluded",
            "startup_allowance_cap_seconds",
            "the step log format",
            "the inference.py interface",
        ),
    ),
}


def phase_of(recipe: dict[str, Any]) -> Phase:
    """The phase a resolved recipe (recipe.json: Phase 1 is not written) is for."""
    return phase(recipe.get("phase", DEFAULT_PHASE))


def phase(number: int) -> Phase:
    """The phase record, or ValueError naming the phases there are."""
    try:
        return PHASES[int(number)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"phase {number!r}: the competition has phases {_either(list(map(str, PHASES)))}") from None
