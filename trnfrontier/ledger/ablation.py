"""`trnf runs table --by KEY`: the ablation table a technical report needs.

Runs grouped by the value of one key (a recipe key path such as ``optim.matrix_lr``, or a
sweep parameter), each setting's mean score, spread and confidence interval over its runs
(seeds), and its difference from a baseline setting with that difference's interval and
Welch's test. A setting that trained more than 10% more or fewer steps than the baseline
is flagged CONFOUNDED; one that ran in another speed environment says so. Printed as
Markdown, LaTeX or CSV.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict
from typing import Any

from trnfrontier import stats
from trnfrontier.errors import UsageError
from trnfrontier.ledger import confound, reader, scores
from trnfrontier.ledger.compare import check_comparable

FORMATS = ("md", "latex", "csv")


def value_of(run: dict[str, Any], key: str) -> Any:
    """The run's value of ``key``: a sweep parameter, else the resolved recipe's."""
    params = run.get("sweep_params") or {}
    if key in params:
        return params[key]
    return reader.flatten(run.get("recipe_json") or {}).get(key, _MISSING)


_MISSING = object()


def _label(value: Any) -> str:
    return "null" if value is None else str(value)


def build(runs: list[dict[str, Any]], key: str, baseline: str | None = None, confidence: float = 0.95) -> dict[str, Any]:
    """The table as a JSON-ready document (rows in the order of their values)."""
    pairs = [(run, scores.primary_score(run)) for run in runs]
    scored = [(run, score) for run, score in pairs if score is not None]
    if not scored:
        raise UsageError("no scored runs match; `trnf runs` lists them (score runs with `trnf eval`)")
    check_comparable(scored)
    groups: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for run, score in scored:
        value = value_of(run, key)
        if value is _MISSING:
            raise UsageError(f"--by {key}: run {run['name']} has no such recipe key or sweep parameter")
        groups.setdefault(_label(value), []).append((run, score))
    labels = sorted(groups, key=_sort_key)
    chosen = baseline if baseline is not None else labels[0]
    if chosen not in groups:
        raise UsageError(f"--baseline {baseline}: no run has {key}={baseline} (settings: {', '.join(labels)})")
    base = groups[chosen]
    rows = [_row(label, groups[label], base, label == chosen, confidence) for label in labels]
    setting = {name: scored[0][1].get(name) for name in scores.SETTING_FIELDS}
    return {"by": key, "baseline": chosen, "confidence": confidence, "setting": setting, "rows": rows}


def _sort_key(label: str) -> tuple[int, float, str]:
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def _row(label: str, group: list[tuple[dict[str, Any], dict[str, Any]]], base: list[tuple[dict[str, Any], dict[str, Any]]],
         is_base: bool, confidence: float) -> dict[str, Any]:  # fmt: skip
    values = [s["val_bpb"] for _, s in group]
    summary = stats.describe(values)
    _, half = stats.mean_interval(values, confidence)
    runs = [r for r, _ in group]
    row: dict[str, Any] = {"value": label, **asdict(summary), "ci_half_width": half,
                           "steps": _mean([r.get("steps") for r in runs]), "runs": [r["name"] for r in runs]}  # fmt: skip
    if is_base:
        row.update(baseline=True, difference=None, confounded=None, environment_differences=[])
        return row
    diff = stats.welch([s["val_bpb"] for _, s in base], values, confidence)
    base_runs = [r for r, _ in base]
    row.update(baseline=False, difference=asdict(diff), confounded=confound.confounded(base_runs, runs),
               environment_differences=confound.environment_differences(base_runs, runs))  # fmt: skip
    return row


def _mean(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, (int, float))]
    return sum(numbers) / len(numbers) if numbers else None


def _cells(row: dict[str, Any]) -> list[str]:
    """value, n, mean, sd, CI, steps, difference vs baseline, p, note."""
    def num(value: Any, spec: str) -> str:
        return "-" if not isinstance(value, (int, float)) or not math.isfinite(value) else format(value, spec)

    d = row["difference"]
    if d is None:
        versus, p = "baseline", "-"
    else:
        half = None if d["low"] is None else (d["high"] - d["low"]) / 2
        versus = f"{d['difference']:+.4f}" + (f" ± {half:.4f}" if half is not None else "")
        p = num(d["p_value"], ".3f")
    notes = (["CONFOUNDED (steps)"] if row["confounded"] else []) + [
        f"{e['key']} differs" for e in row["environment_differences"]
    ]  # fmt: skip
    ci = "-" if row["ci_half_width"] is None else f"± {row['ci_half_width']:.4f}"
    return [row["value"], str(row["n"]), f"{row['mean']:.4f}", num(row["sd"], ".4f"), ci,
            num(row["steps"], ",.0f"), versus, p, "; ".join(notes)]  # fmt: skip


def render(document: dict[str, Any], fmt: str) -> str:
    """The table as Markdown, LaTeX (a tabular) or CSV."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    level = f"{100 * document['confidence']:g}%"
    header = [document["by"], "n", "val_bpb mean", "sd", f"{level} CI", "steps", f"vs {document['baseline']}", "p", "note"]
    body = [_cells(row) for row in document["rows"]]
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerows([header, *body])
        return buffer.getvalue()
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
        return "\n".join(lines) + "\n"
    return _latex(header, body)


# LaTeX's special characters in the order they are replaced (the backslash first, so the
# escapes added later are not escaped again; the plus-minus sign becomes math last).
_TEX = (("\\", r"\textbackslash{}"), ("$", r"\$"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("±", r"$\pm$"))


def _tex(text: str) -> str:
    for char, escaped in _TEX:
        text = text.replace(char, escaped)
    return text


def _latex(header: list[str], body: list[list[str]]) -> str:
    lines = [r"\begin{tabular}{l" + "r" * (len(header) - 2) + "l}", r"\hline", " & ".join(_tex(h) for h in header) + r" \\", r"\hline"]
    lines += [" & ".join(_tex(cell) for cell in row) + r" \\" for row in body]
    lines += [r"\hline", r"\end{tabular}"]
    return "\n".join(lines) + "\n"
