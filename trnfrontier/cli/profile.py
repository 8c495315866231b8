"""`trnf profile RECIPE [key.path=value ...]`: where the step time goes, and what it buys."""

from __future__ import annotations

from pathlib import Path

import typer

from trnfrontier.console import err, keep_wide, out, print_json
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.recipes import load_recipe


def command(
    ctx: typer.Context,
    recipe: str | None = typer.Argument(None, help="Recipe file or shipped name (cpu_smoke, baseline_d10, muon_gqa)."),
    steps: int = typer.Option(10, "--steps", min=1, help="Measured steps (each also timed once phase-split)."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Untimed steps first (compilation, allocator warm-up)."),
    trace: Path | None = typer.Option(None, "--trace", help="Write a Chrome/Perfetto trace of the profiled steps here."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON document instead of tables."),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, neuron or auto (default: the recipe's)."),
    compare: bool = typer.Option(False, "--compare", help="Profile RECIPE against a second recipe given after it, alternating."),
    top: int = typer.Option(12, "--top", min=1, help="Operators to list."),
    kernels: bool = typer.Option(False, "--kernels", help="Benchmark the NKI kernels against their PyTorch references instead."),
) -> None:
    """Build the recipe's model and optimizers, warm up, time N steps split into data,
    forward, backward, optimizer, communication and idle; report tokens/s, FLOPs/token,
    TFLOP/s, MFU, peak memory, top operators and the budget projection.

    Overrides (`key.path=value`) follow the recipe(s) and apply to every recipe named.
    `--compare A B` times A and B in alternating rounds and reports B/A with its spread."""
    from trnfrontier.profiling import compare as compare_mod
    from trnfrontier.profiling import report, run

    run.check_options(device, trace)
    if kernels:
        _kernels(device or "auto", json_output)
        return
    if recipe is None:
        raise UsageError("give a RECIPE (file or shipped name), or --kernels")
    extra = list(ctx.args)
    overrides = [a for a in extra if "=" in a and not a.startswith("-")]
    others = [a for a in extra if a not in overrides]
    unknown_options = [a for a in others if a.startswith("-")]
    if unknown_options:
        raise UsageError(f"unknown option {unknown_options[0]} for `trnf profile` (see trnf profile --help)")
    if compare:
        if len(others) != 1:
            raise UsageError("--compare needs exactly two recipes: trnf profile --compare RECIPE_A RECIPE_B [key=value ...]")
    elif others:
        raise UsageError(f"unexpected argument {others[0]!r}: overrides are key.path=value; two recipes need --compare")
    if compare and trace is not None:
        raise UsageError("--trace profiles one recipe; drop it with --compare")

    recipe_a = load_recipe(recipe, overrides)
    if compare:
        recipe_b = load_recipe(others[0], overrides)
        setup_a = run.build(recipe_a, device)
        setup_b = run.build(recipe_b, device)
        err().print(f"comparing {recipe_a.name} and {recipe_b.name} on {setup_a.spec.name} ...")
        result = compare_mod.compare(setup_a, setup_b, steps, warmup)
        if json_output:
            print_json(result)
        else:
            report.render_compare(result, out())
        return

    setup = run.build(recipe_a, device)
    err().print(f"profiling {recipe_a.name} on {setup.spec.name}: {warmup} warm-up + 2 x {steps} steps ...")
    result = run.profile(setup, steps, warmup, top=top, trace=trace)
    if json_output:
        print_json(result)
    else:
        report.render_profile(result, out())


def _kernels(device: str, json_output: bool) -> None:
    """`--kernels`: trnfrontier.runtime.kernels.bench's rows as a table (or its JSON)."""
    try:
        from trnfrontier.runtime.kernels.bench import benchmark_kernels
    except ImportError:
        raise TrnfError("`trnf profile --kernels` is not available yet: trnfrontier.runtime.kernels.bench has not landed") from None
    from rich.table import Table

    from trnfrontier.runtime import devices

    try:
        resolved = devices.resolve_device(device)
    except devices.DeviceError as exc:
        raise TrnfError(str(exc)) from None
    rows = benchmark_kernels(resolved)
    if json_output:
        print_json({"device": str(resolved), "kernels": rows})
        return
    console = out()
    keep_wide(console, 160)
    table = Table(title=f"kernels on {resolved} (each against its PyTorch reference, same run)")
    for column in ("kernel", "shape", "dtype", "impl", "kernel time", "reference time", "speedup", "achieved", "of peak"):
        table.add_column(column, justify="left" if column in ("kernel", "shape", "dtype", "impl") else "right")
    for row in rows:
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
