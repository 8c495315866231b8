"""The run's loss curve (matplotlib) and the write-up written into the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trnfrontier import plots
from trnfrontier.packaging.run_report import write_run_report
from trnfrontier.packaging.writeup import FACTS_MARKER
from trnfrontier.recipes.loading import load_recipe

PNG = b"\x89PNG\r\n\x1a\n"


def _records(steps: int = 30) -> list[dict]:
    records = []
    for step in range(1, steps + 1):
        record = {"step": step, "loss": 9.0 - 0.1 * step, "charged_seconds": 0.0 if step <= 5 else 2.0 * (step - 5)}
        if step % 10 == 0:
            record["val_bpb"] = 3.0 - 0.05 * step
        records.append(record)
    return records


def test_the_run_curve_has_axes_units_title_train_validation_and_budget() -> None:
    figure = plots.run_loss_figure(_records(), title="r: training loss", budget_seconds=120.0, final_val_bpb=1.4)
    try:
        loss_axis, bpb_axis = figure.axes
        assert loss_axis.get_title() == "r: training loss"
        assert loss_axis.get_xlabel() == "charged training time (s)"
        assert "nats/token" in loss_axis.get_ylabel() and "bits per byte" in bpb_axis.get_ylabel()
        train = loss_axis.lines[0]
        assert list(train.get_ydata()) == pytest.approx([9.0 - 0.1 * s for s in range(1, 31)])
        budget = [line for line in loss_axis.lines if list(line.get_xdata()) == [120.0, 120.0]]
        assert budget, "no vertical line at the budget"
        val_points = list(bpb_axis.lines[0].get_ydata())
        assert val_points == pytest.approx([2.5, 2.0, 1.5])
        assert list(bpb_axis.lines[1].get_ydata()) == [1.4]  # the final, trusted score
        assert len(loss_axis.get_xticks()) > 2 and len(loss_axis.get_yticks()) > 2
        legend = [text.get_text() for text in loss_axis.get_legend().get_texts()]
        assert "budget (120 s)" in legend and "training loss" in legend
    finally:
        plots._pyplot().close(figure)
    png = plots.png_bytes(plots.run_loss_figure(_records(), title="t", budget_seconds=120.0))
    assert png.startswith(PNG) and png == plots.png_bytes(plots.run_loss_figure(_records(), title="t", budget_seconds=120.0))


def test_without_charged_seconds_the_curve_is_by_step() -> None:
    records = [{"step": s, "loss": 5.0 - 0.1 * s} for s in range(1, 6)]
    figure = plots.run_loss_figure(records, title="kit", budget_seconds=1800.0)
    try:
        assert figure.axes[0].get_xlabel() == "optimizer step"
    finally:
        plots._pyplot().close(figure)


def _finished_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    recipe = load_recipe("cpu_smoke").model_dump(mode="json")
    (run / "recipe.json").write_text(json.dumps(recipe))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    summary = {"name": "cpu_smoke", "status": "completed", "val_bpb": 1.4, "budget_seconds": 120.0,
               "steps": 30, "params": 2457600, "tokens": 30 * 1024, "charged_seconds": 50.0}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_a_finished_run_gets_writeup_and_curve_in_its_directory(tmp_path: Path) -> None:
    run = _finished_run(tmp_path)
    written = write_run_report(run)
    assert sorted(p.name for p in written) == ["WRITEUP.md", "loss_curve.png"]
    assert (run / "loss_curve.png").read_bytes().startswith(PNG)
    text = (run / "WRITEUP.md").read_text()
    assert "| steps | 30 |" in text and "![training loss and validation bits per byte](loss_curve.png)" in text

    # The team edits the approach; a rewrite keeps it and regenerates the facts once.
    (run / "WRITEUP.md").write_text(text.replace("_Describe the approach here (edit this file before submitting)._", "We tuned the LR."))
    write_run_report(run)
    again = (run / "WRITEUP.md").read_text()
    assert "We tuned the LR." in again and again.count("## Run facts") == 1 and again.count(FACTS_MARKER) == 1


def test_trnf_train_writes_them_when_the_run_finishes(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.cli_run import run_cli
    from trnfrontier.train import plan as planning
    from trnfrontier.train import supervise

    def finished(plan: planning.RunPlan, **_: object) -> dict:
        made = _finished_run(tmp_path)
        plan.run_dir.mkdir(parents=True, exist_ok=True)
        for path in made.iterdir():
            path.rename(plan.run_dir / path.name)
        return json.loads((plan.run_dir / "summary.json").read_text())

    monkeypatch.setattr(supervise, "run_plan", finished)
    run = tmp_path / "out"
    code, _, err = run_cli(["train", "cpu_smoke", "--out", str(run)], capsys)
    assert code == 0, err
    assert (run / "WRITEUP.md").is_file() and (run / "loss_curve.png").read_bytes().startswith(PNG)
