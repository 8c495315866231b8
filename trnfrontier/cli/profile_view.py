"""Rich rendering of a profile and of a comparison (the JSON form is the dict itself)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from trnfrontier.console import keep_wide
from trnfrontier.profiling.phases import PHASES


def _si(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:,.2f} {prefix}{unit}"
    return f"{value:,.2f} {unit}".rstrip()


def token_count(tokens: float) -> str:
    """``31,395`` / ``12.3M`` / ``1.25B`` tokens: never ``0.0M`` for a small count."""
    if tokens >= 1e9:
        return f"{tokens / 1e9:,.2f}B"
    if tokens >= 1e6:
        return f"{tokens / 1e6:,.1f}M"
    return f"{tokens:,.0f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def render_profile(result: dict[str, Any], console: Console) -> None:
    keep_wide(console, 160)
    console.print(
        f"[bold]profile[/bold] {result['recipe']} on {result['device']} ({result['dtype']}), "
        f"{result['steps']} measured steps after {result['warmup_steps']} warm-up; "
        f"{result['accum']} x {result['batch_size']} x {result['seq_len']} = {result['tokens_per_step']:,} tokens/step; data: {result['data_source']}"
    )
    phases = Table(title="step time split (synchronised at phase boundaries; mean per phase)")
    for column in ("phase", "time", "share", "host dispatch"):
        phases.add_column(column, justify="left" if column == "phase" else "right")
    for name in PHASES:
        row = result["phases"][name]
        phases.add_row(name, _ms(row["seconds"]), f"{row['share']:.1%}", _ms(row["dispatch_seconds"]))
    phases.add_row("[bold]sum[/bold]", _ms(result["phase_sum_seconds"]), "", "")
    lo, hi = result["step_seconds_spread"]
    phases.add_row(
        "[bold]step (plain, mean)[/bold]", _ms(result["step_seconds_mean"]), "", f"median {_ms(result['step_seconds'])}, range {_ms(lo)}-{_ms(hi)}"
    )
    console.print(phases)
    console.print(f"phase-split step / plain step (fastest of each): {result['phase_sum_over_step']:.3f}")
    console.print(f"communication: {result['communication_note']}")

    numbers = Table(show_header=False, title="throughput")
    numbers.add_column("what")
    numbers.add_column("value", justify="right")
    numbers.add_row("tokens/s", f"{result['tokens_per_second']:,.0f}")
    numbers.add_row("params (embedding)", f"{result['params']:,} ({result['embedding_params']:,})")
    numbers.add_row("FLOPs/token", f"{result['flops_per_token']:,}")
    numbers.add_row("achieved", f"{result['achieved_tflops']:.4f} TFLOP/s")
    numbers.add_row("peak", f"{result['peak_tflops']:.4f} TFLOP/s" if result["peak_tflops"] else "n/a")
    numbers.add_row("MFU", f"{result['mfu']:.2%}" if result["mfu"] is not None else "n/a")
    memory = result["peak_memory"]
    numbers.add_row("peak memory", _si(memory["bytes"], "B") if memory["bytes"] is not None else "n/a")
    console.print(numbers)
    terms = result["flops_terms"]
    console.print(f"FLOPs/token = {result['flops_formula']}; n_layer={terms['n_layer']} n_head={terms['n_head']} head_dim={terms['head_dim']} seq_len={terms['seq_len']}")
    console.print(f"peak: {result['peak_source']}")
    console.print(f"peak memory: {memory['source']}")

    ops = Table(title=f"top operators by self time (torch.profiler, {ops_key(result)})")
    for column in ("operator", "calls", "self/step", "share"):
        ops.add_column(column, justify="left" if column == "operator" else "right")
    for op in result["top_operators"]:
        ops.add_row(op["name"], str(op["calls"]), f"{op['per_step_us'] / 1e3:,.2f} ms", f"{op['share']:.1%}")
    console.print(ops)
    console.print(f"Neuron profiler: {result['neuron_profiler']}")

    p = result["projection"]
    per_param = f", {p['tokens_per_param']:,.1f} tokens/parameter" if p["tokens_per_param"] else ""
    console.print(
        f"[bold]projection[/bold]: {p['train_seconds']:,.0f} s of budget at {p['tokens_per_second_all_processes']:,.0f} tokens/s "
        f"trains {token_count(p['tokens'])} tokens in {p['steps']:,.0f} steps of {p['tokens_per_step']:,} tokens{per_param} ({p['assumption']})"
    )
    if result.get("trace"):
        console.print(f"trace: {result['trace']} (open in https://ui.perfetto.dev or chrome://tracing)")
    for note in result.get("notes", []):
        console.print(f"note: {note}")


def ops_key(result: dict[str, Any]) -> str:
    ops = result["top_operators"]
    return "device time" if ops and ops[0]["sorted_by"] == "self_device_us" else "host CPU time"


def render_kernels(document: dict[str, Any], console: Console) -> None:
    """`trnf profile --kernels`: one row per kernel benchmark."""
    keep_wide(console, 160)
    table = Table(title=f"kernels on {document['device']} (each against its PyTorch reference, same run)")
    for column in ("kernel", "shape", "dtype", "impl", "kernel time", "reference time", "speedup", "achieved", "of peak"):
        table.add_column(column, justify="left" if column in ("kernel", "shape", "dtype", "impl") else "right")
    for row in document["kernels"]:
        if row.get("achieved_tflops") is not None:
            achieved = f"{row['achieved_tflops']:.3f} TFLOP/s"
        elif row.get("achieved_gbps") is not None:
            achieved = f"{row['achieved_gbps']:.2f} GB/s"
        else:
            achieved = "-"
        fraction = row.get("peak_fraction")
        table.add_row(
            str(row.get("name")),
            "x".join(str(d) for d in row.get("shape") or []),
            str(row.get("dtype")),
            str(row.get("impl")),
            f"{row['kernel_ms']:.3f} ms",
            f"{row['reference_ms']:.3f} ms",
            f"x{row['speedup']:.2f}",
            achieved,
            f"{fraction:.1%}" if fraction is not None else "n/a",
        )
    console.print(table)


def render_compare(result: dict[str, Any], console: Console) -> None:
    keep_wide(console, 160)
    table = Table(title=f"compare: {result['rounds']} alternating rounds of {result['steps_per_round']} steps (after {result['warmup_steps']} warm-up each)")
    for column in ("", "recipe", "params", "tokens/step", "step (median)", "tokens/s", "FLOPs/token", "MFU"):
        table.add_column(column, justify="left" if column in ("", "recipe") else "right")
    for key in ("a", "b"):
        side = result[key]
        mfu = side.get("mfu")
        table.add_row(
            key.upper(), side["recipe"], f"{side['params']:,}", f"{side['tokens_per_step']:,}",
            _ms(side["step_seconds"]), f"{side['tokens_per_second']:,.0f}", f"{side['flops_per_token']:,}",
            "n/a" if mfu is None else f"{100 * mfu:.1f}%",
        )
    console.print(table)
    lo, hi = result["ratio_spread"]
    console.print(f"[bold]{result['verdict']['text']}[/bold] on {result['a']['device']}")
    console.print(f"per-round B/A: {', '.join(f'{r:.3f}' for r in result['ratios'])} (range {lo:.3f}-{hi:.3f}; >1 means B trains faster)")
    if result.get("peak_source"):
        console.print(f"MFU peak: {result['peak_source']}")
