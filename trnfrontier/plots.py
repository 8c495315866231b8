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


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


def run_loss_figure(
    records: Sequence[dict[str, Any]],
    *,
    title: str,
    budget_seconds: float | None = None,
    final_val_bpb: float | None = None,
) -> Any:
    """One run's curve: training loss (nats/token, left axis) and validation bits per byte
    (right axis) against charged seconds, with the budget as a vertical line. Against the
    step when the records carry no charged seconds (a kit run's printed lines).

    ``records`` as in metrics.jsonl (``step``, ``loss``, ``charged_seconds``, ``val_bpb``);
    ``final_val_bpb``: the trusted score of the final checkpoint, drawn at the last point.
    Returns the matplotlib figure (``png_bytes`` encodes it; tests read its axes)."""
    plt = _pyplot()
    by_seconds = bool(records) and all(_finite(r.get("charged_seconds")) for r in records)
    x_key, x_label = ("charged_seconds", "charged training time (s)") if by_seconds else ("step", "optimizer step")
    train = [(r[x_key], r["loss"]) for r in records if _finite(r.get(x_key)) and _finite(r.get("loss"))]
    val = [(r[x_key], r["val_bpb"]) for r in records if _finite(r.get(x_key)) and _finite(r.get("val_bpb"))]
    if not train and not val:
        raise TrnfError("the run logged no finite loss (metrics.jsonl); nothing to draw")

    figure, loss_axis = plt.subplots(figsize=(8, 4.5))
    if train:
        xs, ys = zip(*train, strict=True)
        loss_axis.plot(xs, ys, color="tab:blue", linewidth=1.2, marker="." if len(train) < 60 else None,
                       label="training loss")  # fmt: skip
    loss_axis.set_xlabel(x_label)
    loss_axis.set_ylabel("training loss (nats/token)", color="tab:blue")
    loss_axis.grid(True, alpha=0.3)
    handles, labels = loss_axis.get_legend_handles_labels()

    if val or _finite(final_val_bpb):
        bpb_axis = loss_axis.twinx()
        if val:
            vx, vy = zip(*val, strict=True)
            bpb_axis.plot(vx, vy, color="tab:orange", linestyle="none", marker="o", markersize=5,
                          label="validation (bits/byte)")  # fmt: skip
        if _finite(final_val_bpb):
            last_x = max(x for x, _ in train or val)
            bpb_axis.plot([last_x], [final_val_bpb], color="tab:red", linestyle="none", marker="*", markersize=12,
                          label=f"final val_bpb {final_val_bpb:.4f}")  # fmt: skip
        bpb_axis.set_ylabel("validation bits per byte (val_bpb)", color="tab:orange")
        more_handles, more_labels = bpb_axis.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels

    if by_seconds and _finite(budget_seconds):
        budget_line = loss_axis.axvline(budget_seconds, color="tab:gray", linestyle="--", linewidth=1)
        handles.append(budget_line)
        labels.append(f"budget ({budget_seconds:g} s)")
    loss_axis.legend(handles, labels, fontsize="small", loc="upper right")
    loss_axis.set_title(title)
    figure.tight_layout()
    return figure


def png_bytes(figure: Any) -> bytes:
    """The figure as PNG bytes, without the matplotlib version stamp (the same run gives
    the same bytes on one machine, so a packaged archive is reproducible there)."""
    import io

    buffer = io.BytesIO()
    try:
        figure.savefig(buffer, format="png", dpi=120, metadata={"Software": None})
    finally:
        _pyplot().close(figure)
    return buffer.getvalue()
