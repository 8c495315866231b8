"""`trnf profile RECIPE [key.path=value ...]`: where the step time goes, and what it buys."""

from __future__ import annotations

from pathlib import Path

import typer

from trnfrontier.console import out, print_json
from trnfrontier.errors import UsageError


def command(
    ctx: typer.Context,
    recipe: str | None = typer.Argument(None, help="Recipe file or shipped name (`trnf recipes list` shows them)."),
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
    from trnfrontier.cli import profile_view
    from trnfrontier.profiling.arguments import check_comparable, check_options, split_arguments
    from trnfrontier.progress import steps as steps_progress

    check_options(device, trace)
    if kernels:
        from trnfrontier.profiling import measure

        document = measure.benchmark_kernels(device or "auto")
        if json_output:
            print_json(document)
        else:
            profile_view.render_kernels(document, out())
        return
    if recipe is None:
        raise UsageError("give a RECIPE (file or shipped name), or --kernels")
    overrides, second = split_arguments(list(ctx.args), compare=compare, trace=trace)

    from trnfrontier.recipes import load_recipe

    recipe_a = load_recipe(recipe, overrides)
    recipe_b = load_recipe(second, overrides) if second is not None else None
    if recipe_b is not None:
        check_comparable(recipe_a, recipe_b)
    # Only now, with every argument checked: measure imports torch.
    from trnfrontier.profiling import compare as compare_mod
    from trnfrontier.profiling import measure

    if recipe_b is not None:
        setup_a = measure.build(recipe_a, device)
        setup_b = measure.build(recipe_b, device)
        what = f"comparing {recipe_a.name} and {recipe_b.name} on {setup_a.spec.name}"
        with steps_progress(what, compare_mod.compare_units(steps, warmup)) as bar:
            result = compare_mod.compare(setup_a, setup_b, steps, warmup, progress=bar)
        if json_output:
            print_json(result)
        else:
            profile_view.render_compare(result, out())
        return

    setup = measure.build(recipe_a, device)
    what = f"profiling {recipe_a.name} on {setup.spec.name}: {warmup} warm-up + 2 x {steps} steps"
    with steps_progress(what, measure.profile_units(steps, warmup)) as bar:
        result = measure.profile(setup, steps, warmup, top=top, trace=trace, progress=bar)
    if json_output:
        print_json(result)
    else:
        profile_view.render_profile(result, out())
