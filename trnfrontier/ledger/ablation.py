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
from trnfrontier.runtime.recipe import SEED_KEY
from trnfrontier.runtime.rundir import COMPLETED, CRASHED, DIVERGED, INTERRUPTED, TIMED_OUT

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
    """The table as a JSON-ready document (rows in the order of their values). ``runs``
    are every run asked about: those that completed with a score make the rows; the
    others are counted per setting as left out (``left_out``), and the keys that vary
    within a row besides ``key`` are named (``pooled``), as the notes under the table do."""
    pairs = [(run, scores.primary_score(run) if run.get("status") == COMPLETED else None) for run in runs]
    scored = [(run, score) for run, score in pairs if score is not None]
    left_out = _left_out([run for run, score in pairs if score is None], key)
    if not scored:
        counted = f" ({_counts_text(_total(left_out))} left out)" if left_out else ""
        raise UsageError(f"no scored runs match{counted}; `trnf runs` lists them (score runs with `trnf eval`)")
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
    for row in rows:
        row["pooled"] = pooled(key, [run for run, _ in groups[row["value"]]])
        row["left_out"] = left_out.get(row["value"], {})
    setting = {name: scored[0][1].get(name) for name in scores.SETTING_FIELDS}
    document = {"by": key, "baseline": chosen, "confidence": confidence, "setting": setting, "rows": rows,
                "left_out": {label: left_out[label] for label in sorted(left_out, key=_sort_key)}}  # fmt: skip
    document["notes"] = notes(document)
    return document


# Why a run has no place in the table: ASHA's (or anyone's) stop, a failure, no end yet.
_LEFT_OUT_AS: dict[str, str] = {
    INTERRUPTED: "stopped", CRASHED: "failed", DIVERGED: "failed", TIMED_OUT: "failed", COMPLETED: "unscored",
}  # fmt: skip


def _left_out(runs: list[dict[str, Any]], key: str) -> dict[str, dict[str, int]]:
    """Per setting of ``key``, how many runs are left out and why (stopped, failed, ...)."""
    found: dict[str, dict[str, int]] = {}
    for run in runs:
        value = value_of(run, key)
        if value is _MISSING:
            continue  # not a run of this ablation
        why = _LEFT_OUT_AS.get(str(run.get("status")), "unfinished")
        counts = found.setdefault(_label(value), {})
        counts[why] = counts.get(why, 0) + 1
    return found


def _total(left_out: dict[str, dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for counts in left_out.values():
        for why, n in counts.items():
            total[why] = total.get(why, 0) + n
    return total


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in counts.items())


def pooled(key: str, runs: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The other keys (sweep parameters, overrides) whose values differ among one row's
    runs, with those values: the row's mean pools them."""
    candidates: list[str] = []
    for run in runs:
        named = [*(run.get("sweep_params") or {}), *(w.split("=", 1)[0] for w in run.get("overrides") or [] if "=" in w)]
        # Seeds are not a setting: they are what a row's spread is over.
        candidates += [k for k in named if k not in candidates and k not in (key, SEED_KEY)]
    found: dict[str, list[str]] = {}
    for candidate in candidates:
        values = {"-" if v is _MISSING else _label(v) for v in (value_of(run, candidate) for run in runs)}
        if len(values) > 1:
            found[candidate] = sorted(values, key=_sort_key)
    return found


def notes(document: dict[str, Any]) -> list[str]:
    """The lines under the table: what each row pools, and what it leaves out."""
    lines = []
    mixed = [f"{row['value']}: " + ", ".join(f"{k} {'/'.join(v)}" for k, v in row["pooled"].items())
             for row in document["rows"] if row["pooled"]]  # fmt: skip
    if mixed:
        lines.append(f"note: rows pool runs in which other keys vary too ({'; '.join(mixed)})")
    if document["left_out"]:
        shown = "; ".join(f"{label}: {_counts_text(counts)}" for label, counts in document["left_out"].items())
        lines.append(f"note: left out, with no score ({document['by']} = {shown})")
    return lines


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
    notes += [f"pools {', '.join(row['pooled'])}"] if row["pooled"] else []
    notes += [f"left out {_counts_text(row['left_out'])}"] if row["left_out"] else []
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
        # A blank line first: the notes are a paragraph under the table, not a row of it.
        lines += ["", *document["notes"]] if document["notes"] else []
        return "\n".join(lines) + "\n"
    # LaTeX: the notes as comments after the tabular (the table itself unchanged); CSV: in
    # each row's note column only, so the file stays one table.
    return _latex(header, body) + "".join(f"% {_tex(line)}\n" for line in document["notes"])


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
