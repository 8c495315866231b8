"""summary.json and metrics.jsonl for a kit-mode run, under the names recipe runs use.

The budget numbers come from the step-boundary log through the organisers' own
``prepare.budget_accounting`` (``trnfrontier.contract.budget.account_log``). Per-step
``charged_seconds`` in metrics.jsonl apply the same rule at each boundary: until the
startup boundary everything elapsed is startup (excluded up to the cap), after it the
excluded part is fixed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trnfrontier.contract.steplog import read_step_log
from trnfrontier.kit.logs import PrintedRun
from trnfrontier.runtime.budget_rule import STARTUP_CAP_SECONDS
from trnfrontier.runtime.metrics import MetricsWriter

# Summary fields a recipe run has that a kit run can only learn from what the script prints.
PRINTED_FIELDS = ("final_loss", "tokens_per_second", "mfu", "tokens", "params", "reported_val_bpb")


def charged_by_step(step_log: Path, accounting: dict[str, Any]) -> dict[int, float]:
    """Charged seconds at each recorded boundary, by the organisers' rule (the log read
    from the start time the accounting used, for a log without a header line)."""
    run = read_step_log(step_log, launch=accounting.get("start_time")).last
    start = run.start
    startup = float(accounting["startup_seconds"])
    # excluded_seconds = min(startup, cap); a budget_accounting that omits it is read with the default cap.
    cap = float(accounting.get("excluded_seconds", min(startup, STARTUP_CAP_SECONDS)))
    startup_end = start + startup
    charged: dict[int, float] = {}
    for step, t in run.boundaries:
        elapsed = t - start
        excluded = min(elapsed, cap) if t < startup_end else cap
        charged[step] = elapsed - excluded
    return charged


def write_metrics(path: Path, printed: PrintedRun, charged: dict[int, float]) -> int:
    """One record per printed step line (+ charged_seconds where the step log has that step)."""
    writer = MetricsWriter(path)
    try:
        for record in printed.records:
            row = dict(record)
            if int(record["step"]) in charged:
                row["charged_seconds"] = charged[int(record["step"])]
            writer.write(row)
    finally:
        writer.close()
    return len(printed.records)


def printed_fields(printed: PrintedRun) -> dict[str, Any]:
    """The summary fields read from the script's own output (None where it printed none)."""
    return {
        "final_loss": printed.last("loss"),
        "tokens_per_second": printed.last("tokens_per_second"),
        "mfu": printed.last("mfu"),
        "tokens": printed.last("tokens"),
        "params": printed.params,
        # A step line's val_bpb, else the kit's closing block (its in-process public eval).
        "reported_val_bpb": printed.last("val_bpb") if printed.last("val_bpb") is not None
        else printed.block.get("public_val_bpb"),
    }
