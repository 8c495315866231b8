"""The process `trnf train` runs for each trainer (directly, or as torchrun's worker):

    python -m trnfrontier.train.worker --recipe RUN_DIR/recipe.json --out RUN_DIR [--resume]

It binds the trainer's life to its parent (``lifeline.die_with_parent``), then runs the
runtime's entry point unchanged. The runtime cannot do this itself: it is what a
submission carries, and the submission screen forbids ctypes there.
"""

from __future__ import annotations

import os

# First, before anything slow: the parent as it was when this process started.
_FIRST_PARENT = os.getppid()


def main() -> int:
    from trnfrontier.train.lifeline import die_with_parent

    die_with_parent(_FIRST_PARENT)
    from trnfrontier.runtime.entry import main as entry_main

    return entry_main()


if __name__ == "__main__":
    raise SystemExit(main())
