"""`trnf doctor [--recipe R] [--kernels] [--json]`: is this machine ready for RECIPE?"""

from __future__ import annotations

from typing import Any

import typer

from trnfrontier.console import err, keep_wide, out, print_json

MARK = {
    "ok": "[green]ok[/]",
    "warn": "[yellow]warn[/]",
    "fail": "[red]FAIL[/]",
    "skip": "[dim]skip[/]",
}


def command(
    recipe: str = typer.Option(
        "baseline_d10",
        "--recipe",
        help="Recipe whose runtime.lnc, nproc and shapes to check against.",
    ),
    kernels: bool = typer.Option(
        False,
        "--kernels",
        help="Also run every NKI kernel against its reference under LNC 1 and 2.",
    ),
    json_output: bool = typer.Option(
        False, "--json", help="Print one JSON document instead of tables."
    ),
) -> None:
    """Neuron SDK, torch and torch-neuronx versions; visible NeuronCores against LNC and
    nproc; the compile cache and its free disk; suspicious NEURON_CC_FLAGS. With --kernels,
    each kernel against its PyTorch reference (on a NeuronCore where there is one, else
    under the NumPy interpreter at small shapes, saying what that skips). Exits 1 when a
    check fails."""
    from trnfrontier import doctor

    if kernels:
        err().print("running the NKI kernels against their references (LNC 1 and 2) ...")
    document = doctor.report(recipe, kernels=kernels)
    if json_output:
        print_json(document)
    else:
        _render(document)
    if document["status"] == "fail":
        raise typer.Exit(1)


def _render(doc: dict[str, Any]) -> None:
    from rich.table import Table

    console = out()
    keep_wide(console, 120)
    env = doc["environment"]
    table = Table(title=f"trnf doctor ({doc['recipe']}: LNC={env['lnc']}, nproc={env['nproc']})")
    for col in ("check", "", "detail"):
        table.add_column(col)
    for c in env["checks"]:
        table.add_row(c["name"], MARK[c["status"]], c["detail"])
    console.print(table)
    if "kernels" in doc:
        _render_kernels(doc["kernels"], console)


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value * 1e3:.2f}"


def _render_kernels(k: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    shapes = ", ".join(f"{key}={value}" for key, value in k["shapes"].items())
    table = Table(title=f"kernels ({k['mode']}, {k['dtype']}; {shapes})")
    for col in ("kernel", "LNC", "", "max err", "tol", "first call ms", "kernel ms", "PyTorch ms"):
        table.add_column(col)
    for r in k["results"]:
        if "error" in r:
            table.add_row(r["kernel"], str(r["lnc"]), MARK[r["status"]], r["error"])
            continue
        timed = k["mode"] == "neuron"
        table.add_row(
            r["kernel"],
            str(r["lnc"]),
            MARK[r["status"]],
            f"{r['max_abs_error']:.2e}",
            f"{r['tolerance']:.1e}",
            _ms(r["first_call_s"]),
            _ms(r["kernel_s"]) if timed else "",
            _ms(r["reference_s"]) if timed else "",
        )
    console.print(table)
    for line in k["skipped"]:
        console.print(f"[yellow]skipped[/]: {line}")
