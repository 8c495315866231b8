"""The `trnf ...` lines trnf prints for the user to type next (resume, start again, verify).

They carry the trusted prepare.py this invocation used when it is not the project's own
(`trnf --prepare PATH`, or ``$TRNF_PREPARE``): a kit team's restart or verify line without
it would run against trnf's prepare.py instead of the kit's.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from trnfrontier.runtime.prepare_loader import PREPARE_ENV
from trnfrontier.trusted_prepare import project_root_file


def trnf_line(*args: str) -> str:
    """``trnf [--prepare PATH] ARGS...``, quoted for a POSIX shell."""
    chosen = os.environ.get(PREPARE_ENV)
    head = ["trnf"]
    if chosen:
        path = Path(chosen).expanduser().resolve()
        own = project_root_file("prepare.py")
        if own is None or path != own.resolve():
            head += ["--prepare", str(path)]
    return shlex.join([*head, *args])
