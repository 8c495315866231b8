"""Which NKI version the interpreter models: the rules that differ between releases.

The competition's DLAMI (Neuron 2.32 era) ships NKI 0.6; Neuron 2.33 (October 2026)
ships NKI 0.7, which specialises kernels by Python tracing instead of parsing them,
removes ``nl.dynamic_range`` and rejects a kernel launched with an LNC degree other than
the one the process runs with. A team may have either, so every rule that differs is a
field here and each interpreter check reads it from the version in force
(``machine.STATE.version``, set per kernel call).

Choosing: ``load_kernel_module(..., nki_version="0.7")``, else ``$TRNF_NKI_VERSION``, else
the installed ``nki`` package's version (package metadata, nothing imported), else
:data:`DEFAULT` (0.6, the competition's). Sources per field: kernels/README.md, section 6.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata

from .machine import NkiInterpreterError

ENV = "TRNF_NKI_VERSION"


@dataclass(frozen=True)
class NkiVersion:
    name: str
    # a for-loop target that is a tuple (``for a, b in pairs``): the 0.6 front-end (KLR's
    # Simplify.lean, forLoop -> simpleVar) takes one simple variable; 0.7 traces Python
    tuple_loop_targets: bool
    # nl.dynamic_range exists (0.6 language guide, "dynamic loops"); removed in 0.7
    dynamic_range: bool
    # a launch grid other than the process's LNC (NEURON_LOGICAL_NC_CONFIG) is rejected
    lnc_must_match: bool
    # activation_reduce takes a compile-time scalar bias: 0.6 documents its bias as "a
    # vector"; 0.7 documents activation_reduce as activation with reduce_cmd=reset_reduce,
    # whose bias may be a scalar on NeuronCore-v3
    activation_reduce_scalar_bias: bool


VERSIONS = {
    "0.6": NkiVersion("0.6", False, True, False, False),
    "0.7": NkiVersion("0.7", True, False, True, True),
}
DEFAULT = "0.6"


def _installed() -> str | None:
    try:
        return metadata.version("nki")
    except metadata.PackageNotFoundError:
        return None


def _major_minor(text: str) -> str:
    numbers = re.findall(r"\d+", text)
    return ".".join(numbers[:2]) if len(numbers) >= 2 else text


def resolve(explicit: str | None = None) -> NkiVersion:
    """The version to model: explicit, else $TRNF_NKI_VERSION, else installed nki, else 0.6.

    An installed release newer than every modelled one is modelled as the newest (its rules
    are the closest known); an unknown explicit or environment choice is an error."""
    chosen = explicit or os.environ.get(ENV)
    if chosen:
        key = _major_minor(chosen)
        if key not in VERSIONS:
            raise NkiInterpreterError(
                f"NKI version {chosen!r} is not modelled; choose one of {', '.join(VERSIONS)}"
            )
        return VERSIONS[key]
    installed = _installed()
    if installed is None:
        return VERSIONS[DEFAULT]
    key = _major_minor(installed)
    if key in VERSIONS:
        return VERSIONS[key]
    known = sorted(VERSIONS, key=lambda k: tuple(int(p) for p in k.split(".")))
    newer = [k for k in known if _as_tuple(k) <= _as_tuple(key)]
    return VERSIONS[newer[-1] if newer else known[0]]


def _as_tuple(key: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", key))
