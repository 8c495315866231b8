"""metrics.jsonl: one JSON object per logged step, flushed at once so a live display (or a
person with ``tail -f``) sees every step as it lands."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, TextIO

from trnfrontier.runtime.atomic import atomic_write_bytes


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf; a diverged loss is logged as null rather than an invalid document.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsWriter:
    """Append-only JSON-lines writer (rank 0 only: other ranks pass ``enabled=False``)."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        self._handle: TextIO | None = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._handle is None:
            return
        self._handle.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            self._handle = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a metrics file (a torn last line from a kill is skipped)."""
    records = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def truncate_after(path: Path, step: int) -> None:
    """Drop records past ``step`` (a resumed run replays those steps from its checkpoint)."""
    path = Path(path)
    if not path.exists():
        return
    kept = [r for r in read_metrics(path) if int(r.get("step", 0)) <= step]
    atomic_write_bytes(path, "".join(json.dumps(r) + "\n" for r in kept).encode("utf-8"))
