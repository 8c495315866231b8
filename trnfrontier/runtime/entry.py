"""The process torchrun (or `trnf train` directly) starts:

    python -m trnfrontier.runtime.entry --recipe RUN_DIR/recipe.json --out RUN_DIR [--resume]

Exit status: 0 completed, 3 diverged (summary.json says at which step), 1 crashed.
Standard library, torch and prepare only: this runs with nothing of the tool installed.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from trnfrontier.runtime.prepare_loader import load_prepare


def main(argv: list[str] | None = None) -> int:
    # prepare.py records PROCESS_START_TIME when it is imported and the budget clock runs
    # from there: import it before torch and the model, as a kit train.py does at its top.
    load_prepare()
    from trnfrontier.runtime.rundir import EXIT_FAILED, exit_code_for
    from trnfrontier.runtime.trainer import train

    parser = argparse.ArgumentParser(
        prog="python -m trnfrontier.runtime.entry", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--recipe", required=True, type=Path, help="the resolved recipe (JSON)")
    parser.add_argument("--out", required=True, type=Path, help="the run directory")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the run's latest checkpoint"
    )
    args = parser.parse_args(argv)
    try:
        recipe = json.loads(args.recipe.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        parser.error(f"--recipe {args.recipe}: {exc}")
    from trnfrontier.runtime.faults import fault_line
    from trnfrontier.runtime.runlock import RunLockedError

    try:
        summary = train(recipe, args.out, resume=args.resume)
    except RunLockedError as exc:  # a second writer: one line, and nothing written
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        line = fault_line(exc)
        if line is None:
            raise  # a bug: its traceback is the report
        # An expected fault (the summary says so): the traceback stays in the run's log
        # (stderr is train.log), and its one line ends the log, as `trnf train` shows it.
        traceback.print_exc()
        print(f"error: {line}", file=sys.stderr)
        return EXIT_FAILED
    return exit_code_for(summary.get("status"))


if __name__ == "__main__":
    sys.exit(main())
