"""Rich consoles bound to the current stdout/stderr (created per call, so tests can capture)."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console


def out() -> Console:
    """Human output (tables, progress) on stdout."""
    return Console(file=sys.stdout, highlight=False, soft_wrap=True)


def err() -> Console:
    """Progress bars and notes on stderr, so `--json` stdout stays machine-readable."""
    return Console(file=sys.stderr, highlight=False, soft_wrap=True)


def keep_wide(console: Console, columns: int) -> None:
    """Piped or captured (not a terminal): at least ``columns`` wide, so that table cells
    (hashes, paths, operator names) print whole instead of folding."""
    if not console.is_terminal:
        console.width = max(console.width, columns)


def print_json(document: Any) -> None:
    """One JSON document on stdout, for scripts and CI."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()
