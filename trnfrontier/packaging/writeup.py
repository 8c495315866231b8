"""WRITEUP.md (generated, then the team's to edit) and the loss-curve PNG beside it.

The PNG is drawn with matplotlib (``trnfrontier.plots``, Agg backend, no version stamp):
the tool draws it, never the submission, which needs nothing of it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# Where generated facts go inside a team's --writeup file; without it they go after the text.
FACTS_MARKER = "<!-- trnf:facts -->"


# ---------------------------------------------------------------------------- loss curve


def read_metrics(metrics: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (missing file: none; a torn or foreign line is skipped)."""
    records: list[dict[str, Any]] = []
    if not metrics.is_file():
        return records
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_loss_points(metrics: Path) -> list[tuple[float, float]]:
    """(step, loss) of every finite logged loss in a metrics.jsonl (missing file: none)."""
    points = []
    for record in read_metrics(metrics):
        try:
            step, loss = float(record["step"]), float(record["loss"])
        except (ValueError, KeyError, TypeError):
            continue
        if math.isfinite(step) and math.isfinite(loss):
            points.append((step, loss))
    return points


def loss_curve_png(records: list[dict[str, Any]], summary: dict[str, Any]) -> bytes | None:
    """The run's loss curve (matplotlib: axes, units, train and validation points, the
    budget) as PNG bytes; None when the run logged no loss."""
    from trnfrontier import plots

    if not read_loss_records(records):
        return None
    val = summary.get("val_bpb")
    figure = plots.run_loss_figure(
        records,
        title=f"{summary.get('name') or 'run'}: training loss and validation bits per byte",
        budget_seconds=summary.get("budget_seconds"),
        final_val_bpb=val if isinstance(val, (int, float)) else None,
    )
    return plots.png_bytes(figure)


def read_loss_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that carry a finite loss."""
    return [
        r for r in records
        if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"]) and isinstance(r.get("step"), (int, float))
    ]


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
    """The curve's ends in numbers, for a reader without the image."""
    losses = [loss for _, loss in points]
    return (
        f"Training loss {points[0][1]:.4f} nats/token at step {points[0][0]:g} to {points[-1][1]:.4f} "
        f"at step {points[-1][0]:g} (lowest {min(losses):.4f})."
    )


def team_part(text: str) -> str:
    """A WRITEUP.md written by trnf and edited by the team: its text up to and including
    the facts marker (the generated facts below it are regenerated), else all of it."""
    head, marker, _ = text.partition(FACTS_MARKER)
    return head + marker if marker else text


def render_writeup(
    facts: dict[str, Any],
    differences: list[tuple[str, Any, Any]] | None,
    *,
    forced: list[str],
    team_text: str | None = None,
    loss_curve: str | None = None,
    caption: str = "",
    keep_marker: bool = False,
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
        lines += ["### Loss curve", "", f"![training loss and validation bits per byte]({loss_curve})", ""] + (
            [caption, ""] if caption else []
        )
    if forced:
        lines += ["### Packaged with --force", "", "These checks failed and were overridden:", ""]
        lines += [f"- {reason}" for reason in forced]
        lines.append("")
    facts_text = "\n".join(lines)
    if team_text is None:
        # The marker stays: `trnf package` keeps the text above it (the team's) and
        # regenerates the facts below it.
        return (
            f"# {f.get('name')}\n\n## Approach\n\n_Describe the approach here (edit this file before submitting)._\n\n"
            f"{FACTS_MARKER}\n{facts_text}"
        )
    if FACTS_MARKER in team_text:
        # keep_marker: a file that will be written up again (the run directory's) keeps it.
        generated = (FACTS_MARKER + "\n" if keep_marker else "") + facts_text.rstrip("\n")
        return team_text.replace(FACTS_MARKER, generated, 1).rstrip("\n") + "\n"
    return team_text.rstrip("\n") + "\n\n" + facts_text
