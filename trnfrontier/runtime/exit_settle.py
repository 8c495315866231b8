"""Give torch's gloo threads a moment with the GIL free before a rank's Python shuts down.

torch 2.13's gloo worker frees a finished collective (and its tensors, which needs the GIL)
a moment after the caller saw it complete. A rank whose last collective is close to its
exit (the final evaluation's all-reduce) can reach interpreter shutdown first; the worker
then cannot take the GIL and the C++ runtime aborts the rank ("terminate called without an
active exception", see ``trnfrontier/kit/logs.py``) although its script finished, and
torchrun stops the others. Leaving the GIL free ``SETTLE_SECONDS`` first lets the worker
finish: 0 aborts in 20 two-rank runs built to hit the race on a loaded 2-core machine,
against 7 in 20 without.

trnf's own ranks wait in ``runtime.distributed.shutdown``. A team's train.py cannot be
asked to, so the ranks of ``trnf train --train-py`` and of both dry runs start with this
file loaded as the module ``trnf_exit_settle`` (``install``: one ``atexit`` callback that
sleeps in a torchrun worker that imported ``torch.distributed``; atexit runs before the interpreter starts
finalizing). ``add_to_site_packages`` puts it in a clean venv (honoured under
``python -I``), ``add_to_path`` in a PYTHONPATH folder. The file runs inside the team's
process: stdlib only, and it changes nothing else a script does. Only a CPU (gloo)
stand-in needs it, not the organisers' Trn2.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path

MODULE = "trnf_exit_settle"
SETTLE_SECONDS = 0.2


def settle(seconds: float = SETTLE_SECONDS) -> None:
    """Sleep (the GIL released) in a torchrun worker (``TORCHELASTIC_RUN_ID`` set) that
    imported torch.distributed; any other process (the load probe, a helper) exits at once."""
    if "TORCHELASTIC_RUN_ID" in os.environ and "torch.distributed" in sys.modules:
        time.sleep(seconds)


def install() -> None:
    """Settle at exit, once however often called (a venv's ``lib64`` link to ``lib`` makes
    Python read its site-packages, and this ``.pth`` line, twice). Registered at start-up,
    it runs after the script's own atexit callbacks (they run last-in, first-out)."""
    atexit.unregister(settle)
    atexit.register(settle)


# ---- trnf's side: put this file where a rank's Python loads it ----

# A sitecustomize on PYTHONPATH shadows any later one (a distribution's, the user's): after
# installing the settle it runs the next one found on sys.path, so nothing is lost.
_SITECUSTOMIZE = f'''\
import importlib.machinery, importlib.util, os, sys
import {MODULE}
{MODULE}.install()
_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
'''


def _copy_module(folder: Path) -> None:
    (folder / f"{MODULE}.py").write_text(Path(__file__).read_text(encoding="utf-8"), encoding="utf-8")


def add_to_site_packages(site: Path) -> None:
    """Load the settle in every Python of the venv whose site-packages is ``site`` (a
    ``.pth`` import line: honoured under ``python -I``, and it shadows nothing)."""
    _copy_module(site)
    (site / f"{MODULE}.pth").write_text(f"import {MODULE}; {MODULE}.install()\n", encoding="utf-8")


def add_to_path(folder: Path) -> None:
    """Load the settle in every Python with ``folder`` on PYTHONPATH, ahead of any other
    sitecustomize (a sitecustomize that then runs the one it shadows)."""
    folder.mkdir(parents=True, exist_ok=True)
    _copy_module(folder)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
