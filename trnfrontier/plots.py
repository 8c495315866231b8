"""Charts written as PNG files with matplotlib's Agg backend (no display needed).

matplotlib is imported inside each function: `trnf --help` and every command that draws
nothing stay free of it. Each function takes plain data and writes one file atomically
(a temporary name, then a rename), so a chart is either whole or absent.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trnfrontier.errors import TrnfError


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TrnfError("plots need matplotlib: pip install matplotlib") from None
    return plt


def _save(figure: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".tmp-{path.name}")
    try:
        figure.savefig(temporary, dpi=120, bbox_inches="tight", format=path.suffix.lstrip(".") or "png")
        os.replace(temporary, path)
    except OSError as exc:
        raise TrnfError(f"cannot write the chart {path}: {exc}") from None
    finally:
        temporary.unlink(missing_ok=True)
        _pyplot().close(figure)
    return path


def loss_curves(curves: Sequence[tuple[str, Sequence[dict[str, Any]]]], path: Path, x: str = "tokens") -> Path:
    """Training loss of several runs on one chart. ``curves`` is (label, metrics records),
    records as in metrics.jsonl; ``x`` is ``tokens``, ``step`` or ``charged_seconds``.
    Startup steps (not charged) are drawn too: they are part of the curve."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 5))
    drawn = 0
    for label, records in curves:
        points = [
            (r[x], r["loss"])
            for r in records
            if isinstance(r.get(x), (int, float)) and isinstance(r.get("loss"), (int, float))
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            axis.plot(xs, ys, label=label, linewidth=1.2)
            drawn += 1
    if not drawn:
        plt.close(figure)
        raise TrnfError(f"none of the runs has logged losses (metrics.jsonl with '{x}' and 'loss'); nothing to draw")
    axis.set_xlabel({"tokens": "training tokens", "step": "step", "charged_seconds": "charged seconds"}.get(x, x))
    axis.set_ylabel("training loss")
    axis.set_yscale("log")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize="small")
    axis.set_title("training loss")
    return _save(figure, path)


def score_vs_speed(points: Sequence[dict[str, Any]], path: Path) -> Path:
    """val_bpb against tokens/s, one point per run (``name``, ``tokens_per_second``,
    ``val_bpb``, optional ``recipe`` for the colour): where a change bought speed with score."""
    usable = [
        p for p in points if isinstance(p.get("tokens_per_second"), (int, float)) and isinstance(p.get("val_bpb"), (int, float))
    ]
    if not usable:
        raise TrnfError("no run has both a score and a tokens/s; nothing to draw")
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 5))
    recipes = sorted({str(p.get("recipe")) for p in usable})
    for recipe in recipes:
        group = [p for p in usable if str(p.get("recipe")) == recipe]
        axis.scatter([p["tokens_per_second"] for p in group], [p["val_bpb"] for p in group], label=recipe, s=24)
    for p in usable:
        axis.annotate(str(p.get("name")), (p["tokens_per_second"], p["val_bpb"]), fontsize=6, alpha=0.7,
                      xytext=(3, 3), textcoords="offset points")  # fmt: skip
    axis.set_xlabel("tokens/s")
    axis.set_ylabel("val_bpb (lower is better)")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize="small", title="recipe")
    axis.set_title("score against throughput")
    return _save(figure, path)
