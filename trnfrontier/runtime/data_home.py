"""Where prepared data, caches and the run ledger live: prepare.py's rule, written once.

``$NEURON_COMPETITION_R1_CACHE_DIR`` (the organisers' variable), else ``$TRNF_HOME``, else
``~/.cache/trnfrontier``. The runtime (compile cache), the tool (ledger, child processes)
and prepare.py must agree, or a child or a later command looks in an empty folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

HOME_ENV = "TRNF_HOME"
DEFAULT_HOME = "~/.cache/trnfrontier"
KIT_CACHE_DIR_ENV = "NEURON_COMPETITION_R1_CACHE_DIR"


def data_home(environ: Mapping[str, str] | None = None) -> Path:
    """The data/cache root of this process (see the module docstring), as an absolute path."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(KIT_CACHE_DIR_ENV) or environ.get(HOME_ENV) or DEFAULT_HOME
    return Path(chosen).expanduser().resolve()
