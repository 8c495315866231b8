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
        help="Recipe whose device, runtime.lnc, nproc, kernels, dataset and shapes to check.",
    ),
    kernels: bool = typer.Option(
        False,
        "--kernels",
        help="Also run every NKI kernel against its reference under LNC 1 and 2.",
    ),
    json_output: bool = typer.Option(
        False, "--json", help="Print one JSON document instead of a table."
    ),
) -> None:
    """A ladder of checks, cheapest first, each saying what it checked and what it skipped:
    the recipe's real settings; torch, torch-neuronx, nki/neuronx-cc; NeuronCores against
    LNC and nproc; NEURON_CC_FLAGS (--optlevel=1); the Neuron compile cache; free disk; the
    prepared dataset and its data root; torch's compile cache; bubblewrap for verify;
    processes holding /dev/neuron*; torch and the device; nki_op/wrap_nki; a 128x128 relu2
    smoke kernel (on a NeuronCore, else under the NKI interpreter). With --kernels, each
    kernel against PyTorch at LNC 1 and 2. Exits 1 when a rung fails."""
    from trnfrontier import doctor

    def progress(what: str) -> None:
        err().print(f"checking {what} ...")

    document = doctor.report(recipe, kernels=kernels, on_rung=progress)
    if json_output:
        print_json(document)
    else:
        _render(document)
    if document["status"] == "fail":
        raise typer.Exit(1)


def _render(doc: dict[str, Any]) -> None:
    from rich.table import Table

    console = out()
    keep_wide(console, 140)
    table = Table(title=f"trnf doctor ({doc['recipe']}: LNC={doc['lnc']}, nproc={doc['nproc']})")
    for col in ("rung", "", "checked", "skipped"):
        table.add_column(col)
    for c in doc["rungs"]:
        table.add_row(c["name"], MARK[c["status"]], c["checked"], c["skipped"])
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
