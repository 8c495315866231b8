"""WRITEUP.md (generated, then the team's to edit) and the loss-curve PNG beside it.

The PNG is drawn and encoded with the standard library (zlib, struct): a submission's
tooling must not need matplotlib, and the bytes must be the same on every machine so
that the archive is reproducible.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path
from typing import Any

# Where generated facts go inside a team's --writeup file; without it they go after the text.
FACTS_MARKER = "<!-- trnf:facts -->"
_WHITE, _AXIS, _GRID, _LINE = (255, 255, 255), (90, 90, 90), (225, 225, 225), (31, 119, 180)


# ---------------------------------------------------------------------------- loss curve


def read_loss_points(metrics: Path) -> list[tuple[float, float]]:
    """(step, loss) of every finite logged loss in a metrics.jsonl (missing file: none)."""
    points = []
    if not metrics.is_file():
        return points
    for line in metrics.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            step, loss = float(record["step"]), float(record["loss"])
        except (ValueError, KeyError, TypeError):
            continue
        if math.isfinite(step) and math.isfinite(loss):
            points.append((step, loss))
    return points


def _png(width: int, height: int, pixels: list[bytearray]) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    raw = b"".join(b"\x00" + bytes(row) for row in pixels)  # filter type 0 on every row
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def loss_curve_png(points: list[tuple[float, float]], width: int = 640, height: int = 360) -> bytes:
    """A line plot of loss against step (axes and a light grid; no text), as PNG bytes."""
    pixels = [bytearray(_WHITE * width) for _ in range(height)]

    def put(x: int, y: int, color: tuple[int, int, int]) -> None:
        if 0 <= x < width and 0 <= y < height:
            pixels[y][3 * x : 3 * x + 3] = bytes(color)

    def line(x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        error = dx + dy
        while True:
            put(x0, y0, color)
            if x0 == x1 and y0 == y1:
                return
            doubled = 2 * error
            if doubled >= dy:
                error, x0 = error + dy, x0 + sx
            if doubled <= dx:
                error, y0 = error + dx, y0 + sy

    left, right, top, bottom = 40, width - 15, 15, height - 30
    for i in range(1, 5):
        y = top + (bottom - top) * i // 5
        line(left, y, right, y, _GRID)
    line(left, top, left, bottom, _AXIS)
    line(left, bottom, right, bottom, _AXIS)
    if points:
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        x_lo, x_hi = min(xs), max(xs)
        y_lo, y_hi = min(ys), max(ys)
        x_span, y_span = (x_hi - x_lo) or 1.0, (y_hi - y_lo) or 1.0

        def to_px(step: float, loss: float) -> tuple[int, int]:
            return (
                left + round((step - x_lo) / x_span * (right - left)),
                bottom - round((loss - y_lo) / y_span * (bottom - top)),
            )

        previous = to_px(*points[0])
        for point in points[1:] or points:
            current = to_px(*point)
            line(*previous, *current, _LINE)
            previous = current
    return _png(width, height, pixels)


# ---------------------------------------------------------------------------- WRITEUP.md


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def recipe_differences(
    recipe: dict[str, Any], baseline: dict[str, Any]
) -> list[tuple[str, Any, Any]]:
    """(key path, baseline value, this recipe's value) wherever they differ (name/description aside)."""
    mine, base = _flat(recipe), _flat(baseline)
    skip = {"name", "description"}
    return [
        (key, base.get(key), mine.get(key))
        for key in sorted(set(mine) | set(base))
        if key not in skip and mine.get(key) != base.get(key)
    ]


def _fmt(value: Any, spec: str = "", unit: str = "") -> str:
    if value is None:
        return "not measured"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:{spec}}{unit}" if spec else f"{value}{unit}"


def _cell(value: Any) -> str:
    return "`" + json.dumps(value) + "`"


def curve_caption(points: list[tuple[float, float]]) -> str:
    """What the unlabelled plot shows, in numbers."""
    losses = [loss for _, loss in points]
    return (
        f"Loss {points[0][1]:.4f} at step {points[0][0]:g} to {points[-1][1]:.4f} at step {points[-1][0]:g}; "
        f"the y axis spans {min(losses):.4f} (bottom) to {max(losses):.4f} (top), the x axis the logged steps."
    )


def render_writeup(
    facts: dict[str, Any],
    differences: list[tuple[str, Any, Any]] | None,
    *,
    forced: list[str],
    team_text: str | None = None,
    loss_curve: str | None = None,
    caption: str = "",
) -> str:
    """WRITEUP.md: the team's text (or a placeholder) and the generated facts of the run.

    ``facts`` keys: name, source, params, tokens, steps, charged_seconds, startup_seconds,
    budget_seconds, val_bpb, val_bpb_official, eval_tokens, tokens_per_second, mfu,
    device, world_size, launch, kernels.
    """
    f = facts
    lines = [
        "## Run facts (generated by trnf package)",
        "",
        "| | |",
        "| --- | --- |",
        f"| run | {f.get('name')} ({f.get('source')}) |",
        f"| parameters | {_fmt(f.get('params'), ',')} |",
        f"| tokens trained | {_fmt(f.get('tokens'), ',')} |",
        f"| steps | {_fmt(f.get('steps'), ',')} |",
        f"| charged seconds | {_fmt(f.get('charged_seconds'), '.1f')} of {_fmt(f.get('budget_seconds'), 'g')} |",
        f"| startup seconds (excluded) | {_fmt(f.get('startup_seconds'), '.1f')} |",
        f"| val_bpb, public length ({_fmt(f.get('eval_tokens'), ',')} tokens) | {_fmt(f.get('val_bpb'), '.6f')} |",
        f"| val_bpb, official length | {_fmt(f.get('val_bpb_official'), '.6f')} |",
        f"| tokens/s | {_fmt(f.get('tokens_per_second'), ',.0f')} |",
        f"| MFU | {_fmt(None if f.get('mfu') is None else 100 * f['mfu'], '.1f', '%')} |",
        f"| device | {f.get('device') or 'unknown'} x {f.get('world_size') or 1} |",
        f"| launch | `{f.get('launch')}` |",
        f"| NKI kernels | {', '.join(f.get('kernels') or []) or 'none'} |",
        "",
    ]
    if differences is not None:
        lines += ["### Recipe vs recipes/baseline_d10.yaml", ""]
        if differences:
            lines += ["| key | baseline | this run |", "| --- | --- | --- |"]
            lines += [
                f"| {key} | {_cell(base)} | {_cell(mine)} |" for key, base, mine in differences
            ]
        else:
            lines.append("Identical to the baseline recipe.")
        lines.append("")
    if loss_curve:
        lines += ["### Loss curve", "", f"![training loss by step]({loss_curve})", ""] + (
            [caption, ""] if caption else []
        )
    if forced:
        lines += ["### Packaged with --force", "", "These checks failed and were overridden:", ""]
        lines += [f"- {reason}" for reason in forced]
        lines.append("")
    facts_text = "\n".join(lines)
    if team_text is None:
        return f"# {f.get('name')}\n\n## Approach\n\n_Describe the approach here (edit this file before submitting)._\n\n{facts_text}"
    if FACTS_MARKER in team_text:
        return team_text.replace(FACTS_MARKER, facts_text.rstrip("\n"), 1).rstrip("\n") + "\n"
    return team_text.rstrip("\n") + "\n\n" + facts_text
