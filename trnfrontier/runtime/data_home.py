"""Where prepared data, caches and the run ledger live: prepare.py's rule, written once.

``$NEURON_COMPETITION_R1_CACHE_DIR`` (the organisers' variable), else ``$TRNF_HOME``, else
``~/.cache/trnfrontier``. The runtime (compile cache), the tool (ledger, child processes)
and prepare.py must agree, or a child or a later command looks in an empty folder. A
message about missing data says which root is in use and why (``data_root_reason``).
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


def data_root_reason(environ: Mapping[str, str] | None = None) -> str:
    """Which variable chose the data root, in the words a message uses ("chosen by ..."):
    a dataset prepared under ``$TRNF_HOME`` is not found while the kit's variable is set."""
    environ = os.environ if environ is None else environ
    if environ.get(KIT_CACHE_DIR_ENV):
        also = f" (it wins over ${HOME_ENV}={environ[HOME_ENV]})" if environ.get(HOME_ENV) else ""
        return f"${KIT_CACHE_DIR_ENV}{also}"
    if environ.get(HOME_ENV):
        return f"${HOME_ENV} (${KIT_CACHE_DIR_ENV} is not set)"
    return f"the default {DEFAULT_HOME} (neither ${KIT_CACHE_DIR_ENV} nor ${HOME_ENV} is set)"


def hidden_home(environ: Mapping[str, str] | None = None) -> Path | None:
    """``$TRNF_HOME`` when it holds prepared datasets that the kit's variable hides (both
    set, different folders): the usual reason a dataset "is not prepared" though it is."""
    environ = os.environ if environ is None else environ
    home = environ.get(HOME_ENV)
    if not environ.get(KIT_CACHE_DIR_ENV) or not home:
        return None
    path = Path(home).expanduser().resolve()
    return path if path != data_home(environ) and (path / "datasets").is_dir() else None
