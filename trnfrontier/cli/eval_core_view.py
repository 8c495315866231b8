"""What `trnf eval --core` prints for CORE: per-task scores, the metric, the projection."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from trnfrontier.console import keep_wide


def _bundle_line(core: dict[str, Any]) -> str:
    pinned = "pinned" if core["bundle_pinned"] else "[yellow]NOT pinned[/yellow] (pass --bundle-sha256 to pin it)"
    line = f"bundle {core['bundle']}, SHA256 {core['bundle_sha256'][:16]}… of the {core['bundle_sha256_of']}, {pinned}"
    if core["format_sample"]:
        line += "\n[bold yellow]the format sample: a score on it means nothing[/bold yellow]"
    return line


def _projection_line(core: dict[str, Any], device: str) -> str:
    projection = core["projection"]
    limit = projection["limit_seconds"]
    at = ", ".join(
        f"{float(seconds):,.0f} s at {ranks} rank(s)" + ("" if float(seconds) <= limit else " [bold red](over)[/bold red]")
        for ranks, seconds in projection["seconds_at_ranks"].items()
    )
    return (
        f"projected full bundle ({projection['items_in_bundle']:,} items) at this run's cost per item on {device}: {at}; "
        f"the Phase 2 limit is {limit:,.0f} s on the full server (compilation excluded there, included here)"
    )


def render_core(document: dict[str, Any], console: Console) -> None:
    """A table per result that has a CORE report (nothing without --core)."""
    keep_wide(console, 160)
    for r in document["results"]:
        core = r.get("core")
        if not core:
            continue
        table = Table(title=f"CORE of {r['path']}")
        for column in ("task", "type", "shots", "items", "accuracy", "centered", "near-ties"):
            table.add_column(column, justify="left" if column in ("task", "type") else "right")
        for label, task in core["tasks"].items():
            table.add_row(
                label, task["type"], str(task["num_fewshot"]), f"{task['items']:,}",
                f"{task['accuracy']:.4f}", f"{task['centered']:.4f}", str(task["near_ties"]),
            )
        console.print(table)
        full = "" if core["full_metric"] else f" [bold yellow](--max-per-task {core['max_per_task']}: NOT the full metric)[/bold yellow]"
        console.print(f"CORE [bold]{core['core_metric']:.4f}[/bold]{full} in {core['seconds']:.1f} s on {core['world_size']} rank(s)")
        console.print(_bundle_line(core))
        console.print(
            f"crop {core['crop']} tokens ({core['crop_source']}); near-ties: {core['near_ties']} item(s) whose options differ "
            f"by less than {core['near_tie_tolerance']:g} (relative), where padding noise could flip a verdict"
        )
        console.print(_projection_line(core, r.get("device", "this device")))
