"""What every process trnf spawns must be told, so it finds the same data and contract.

A child (a torchrun worker, a fresh eval process, a dry run in a clean environment) finds
its data through prepare.py, which reads ``$TRNF_HOME`` and falls back to
``~/.cache/trnfrontier``. A clean environment replaces ``HOME``, so that fallback would
point into an empty temporary folder: the child must be told the data home explicitly,
resolved here in the parent, whether or not the user ever set ``TRNF_HOME``.

``data_env()`` is the one place that decides what is forwarded; ``child_env(base)`` adds
it to an environment being built. Other forwarding (the organisers'
``NEURON_COMPETITION_R1_*`` variables) belongs here too, so every spawn site gets it.

``DIAGNOSTICS`` is what every child is started with besides: faulthandler, so a fatal
signal (a segfault in a kernel, an abort in a C++ thread) leaves each Python thread's stack
in the child's log, which is also how trnf tells an abort during interpreter shutdown from
a crash (``kit.logs.aborted_after_finishing``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from trnfrontier.contract.kit import ENV_PREFIX
from trnfrontier.runtime.data_home import HOME_ENV, data_home

__all__ = ["DIAGNOSTICS", "child_env", "data_env", "data_home", "diagnostics_env"]

# Forwarded as they are when set: the prepared dataset to read, the trusted prepare.py.
FORWARDED = ("TRNF_DATASET", "TRNF_PREPARE")
# Set for every child unless the environment being built says otherwise.
DIAGNOSTICS = {"PYTHONFAULTHANDLER": "1"}


def data_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a child needs to see this process's data and contract: ``TRNF_HOME``
    always (the default written out), and ``TRNF_DATASET`` / ``TRNF_PREPARE`` when set."""
    environ = os.environ if environ is None else environ
    env = {HOME_ENV: str(data_home(environ))}
    for name in FORWARDED:
        if environ.get(name):
            env[name] = environ[name]
    # The organisers' variables (contract.kit): their prepare.py's data root and step log,
    # their train.py's flag defaults (NUM_STEPS, EVAL_PUBLIC, ...). All forwarded when set.
    env.update({k: v for k, v in environ.items() if k.startswith(ENV_PREFIX)})
    return env


def diagnostics_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``DIAGNOSTICS`` less what ``environ`` (the user's) already sets."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in DIAGNOSTICS.items() if k not in environ}


def child_env(base: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (the environment being built for a child) plus ``data_env()`` and
    ``DIAGNOSTICS``; what ``base`` sets itself wins."""
    return {**DIAGNOSTICS, **data_env(environ), **base}
