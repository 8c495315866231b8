"""What `trnf train` prints when a recipe run ends: its summary as a table."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from trnfrontier.runtime.rundir import COMPLETED


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if spec and isinstance(value, (int, float)):
        return format(value, spec)
    return str(value)


def summary_table(summary: dict[str, Any]) -> Table:
    table = Table(
        title=f"trnf train: {summary.get('name', '')}", show_header=False, title_justify="left"
    )
    table.add_column(style="bold")
    table.add_column()
    status = summary.get("status", "?")
    table.add_row("status", Text(status, style="green" if status == COMPLETED else "red"))
    table.add_row("val_bpb", _fmt(summary.get("val_bpb"), ".6f"))
    if summary.get("eval_tokens") is not None:
        requested, scored = summary.get("eval_tokens"), summary.get("eval_num_tokens")
        tokens = f"{_fmt(requested, ',')} tokens"
        if isinstance(scored, int) and isinstance(requested, int) and scored < requested:
            tokens = f"{scored:,} of {requested:,} tokens (the split holds no more)"
        table.add_row("eval", f"{summary.get('eval_split', 'public_val')}, {tokens}, seq {summary.get('eval_seq_len')}")
    table.add_row("steps", _fmt(summary.get("steps"), ","))
    table.add_row("tokens", _fmt(summary.get("tokens"), ","))
    table.add_row("params", _fmt(summary.get("params"), ","))
    tps = summary.get("tokens_per_second")
    mfu = summary.get("mfu")
    table.add_row("tokens/s", _fmt(tps, ",.0f") + (f" (mfu {100 * mfu:.1f}%)" if mfu else ""))
    table.add_row(
        "charged",
        f"{_fmt(summary.get('charged_seconds'), ',.1f')} / {_fmt(summary.get('budget_seconds'), ',.0f')} s",
    )
    table.add_row("startup", f"{_fmt(summary.get('startup_seconds'), ',.1f')} s")
    table.add_row("headroom", f"{_fmt(summary.get('headroom_seconds'), ',.1f')} s")
    table.add_row("over budget", _fmt(summary.get("over_budget")))
    table.add_row("device", f"{_fmt(summary.get('device'))} x {_fmt(summary.get('world_size'))}")
    if summary.get("diverged_step") is not None:
        table.add_row("diverged at", f"step {summary['diverged_step']}")
    if summary.get("last_good_checkpoint"):
        table.add_row("last good", summary["last_good_checkpoint"])
    if summary.get("final_checkpoint"):
        table.add_row("final", summary["final_checkpoint"])
    if summary.get("prepare_sha256"):
        table.add_row("prepare.py", summary["prepare_sha256"][:16] + "…")
    if summary.get("run_dir"):
        table.add_row("run", summary["run_dir"])
    return table
