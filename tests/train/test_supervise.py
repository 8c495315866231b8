"""trnfrontier/train/supervise.py: following the child, its summary, stopping it."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trnfrontier.cli.train_view import summary_table
from trnfrontier.recipes.loading import load_recipe
from trnfrontier.train import plan as planning
from trnfrontier.train import supervise

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _project_prepare(monkeypatch) -> None:
    monkeypatch.setenv("TRNF_PREPARE", str(REPO / "prepare.py"))


# ---------------------------------------------------------------------------- following the child


def test_metrics_tail_waits_for_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = supervise.MetricsTail(path)
    assert tail.read() == []
    with open(path, "w") as handle:
        handle.write('{"step": 1}\n{"step": 2')
    assert tail.read() == [{"step": 1}]
    with open(path, "a") as handle:
        handle.write("}\n")
    assert tail.read() == [{"step": 2}]


def _plan_with(tmp_path: Path, script: str) -> planning.RunPlan:
    code = tmp_path / "child.py"
    code.write_text(textwrap.dedent(script))
    run = tmp_path / "run"
    return planning.RunPlan(
        recipe=load_recipe("cpu_smoke"),
        run_dir=run,
        resume=False,
        command=[sys.executable, str(code), str(run)],
    )


def test_run_plan_follows_metrics_and_returns_the_summary(tmp_path: Path) -> None:
    plan = _plan_with(
        tmp_path,
        """
        import json, sys, time
        from pathlib import Path
        run = Path(sys.argv[1])
        assert json.loads((run / "recipe.json").read_text())["name"] == "cpu_smoke"
        with open(run / "metrics.jsonl", "a") as m:
            for step in (1, 2, 3):
                m.write(json.dumps({"step": step, "loss": 5.0 - step, "lr": 0.1, "charged_seconds": step}) + "\\n")
                m.flush()
                time.sleep(0.05)
        (run / "summary.json").write_text(json.dumps({"status": "completed", "val_bpb": 1.5}))
        print("child output goes to train.log")
    """,
    )
    seen = []
    summary = supervise.run_plan(plan, live=False, on_record=seen.append, poll_seconds=0.02)
    assert (
        summary["status"] == "completed" and summary["val_bpb"] == 1.5 and summary["exit_code"] == 0
    )
    assert [r["step"] for r in seen] == [1, 2, 3]
    assert "child output goes to train.log" in (plan.run_dir / "train.log").read_text()
    assert supervise.failure_message(summary, plan.run_dir) is None


def test_a_child_that_dies_without_a_summary_is_recorded_as_crashed(tmp_path: Path) -> None:
    plan = _plan_with(
        tmp_path,
        """
        import sys
        raise SystemExit("boom: out of memory")
    """,
    )
    summary = supervise.run_plan(plan, live=False, poll_seconds=0.02)
    assert summary["status"] == "crashed" and summary["exit_code"] == 1
    assert json.loads((plan.run_dir / "summary.json").read_text())["status"] == "crashed"
    message = supervise.failure_message(summary, plan.run_dir)
    assert "train.log" in message and "\n" not in message
    assert "boom: out of memory" in supervise.tail_log(plan.run_dir)


def test_interrupt_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids.txt"
    plan = _plan_with(
        tmp_path,
        f"""
        import json, os, subprocess, sys, time
        from pathlib import Path
        run = Path(sys.argv[1])
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path({str(pids)!r}).write_text(f"{{os.getpid()}} {{worker.pid}}")
        with open(run / "metrics.jsonl", "a") as m:
            m.write(json.dumps({{"step": 1, "loss": 1.0, "lr": 0.1, "charged_seconds": 1}}) + "\\n")
        time.sleep(600)
    """,
    )

    def interrupt(record):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        supervise.run_plan(plan, live=False, on_record=interrupt, poll_seconds=0.02)
    parent, worker = (int(p) for p in pids.read_text().split())
    deadline = time.time() + 20
    while time.time() < deadline:
        alive = []
        for pid in (parent, worker):
            try:
                os.kill(pid, 0)
                # A zombie awaiting its reaper counts as gone.
                with open(f"/proc/{pid}/stat") as stat:
                    if stat.read().split(")")[-1].split()[0] != "Z":
                        alive.append(pid)
            except (ProcessLookupError, FileNotFoundError):
                pass
        if not alive:
            break
        time.sleep(0.1)
    assert not alive, f"processes left running: {alive}"


def test_failure_message_for_divergence(tmp_path: Path) -> None:
    message = supervise.failure_message(
        {
            "status": "diverged",
            "diverged_step": 17,
            "last_good_checkpoint": "runs/x/checkpoints/step_000016",
        },
        tmp_path,
    )
    assert "step 17" in message and "step_000016" in message


def test_summary_table_renders_partial_summaries() -> None:
    from rich.console import Console

    console = Console(record=True, width=100)
    console.print(summary_table({"status": "crashed", "name": "x"}))
    console.print(
        summary_table(
            {
                "status": "completed",
                "name": "x",
                "val_bpb": 1.234567,
                "steps": 10,
                "mfu": 0.3,
                "tokens_per_second": 1000.0,
                "over_budget": False,
            }
        )
    )
    text = console.export_text()
    assert "crashed" in text and "1.234567" in text and "30.0%" in text


def test_live_view_renders_before_and_during_a_run(tmp_path: Path) -> None:
    from rich.console import Console

    console = Console(record=True, width=100)
    console.print(supervise.live_view(None, 120.0, tmp_path, time.time(), None))
    record = {
        "step": 12,
        "loss": 5.4321,
        "lr": 0.02,
        "tokens_per_second": 12345.0,
        "mfu": 0.31,
        "charged_seconds": 30.0,
        "startup": False,
    }
    console.print(supervise.live_view(record, 120.0, tmp_path, time.time(), 1.2345))
    text = console.export_text()
    assert "starting" in text and "5.4321" in text and "12,345" in text and "30.0 / 120 s" in text
    assert "90.0 s" in text and "1.2345" in text and "31.0%" in text


def test_sigterm_to_trnf_stops_the_run_like_ctrl_c(tmp_path: Path) -> None:
    """`kill` / `timeout` / a cancelled CI job: no training process is left running, orphaned."""
    import signal

    pids = tmp_path / "pids.txt"
    plan = _plan_with(
        tmp_path,
        f"""
        import json, os, sys, time
        from pathlib import Path
        run = Path(sys.argv[1])
        Path({str(pids)!r}).write_text(str(os.getpid()))
        with open(run / "metrics.jsonl", "a") as m:
            m.write(json.dumps({{"step": 1, "loss": 1.0, "lr": 0.1, "charged_seconds": 1}}) + "\\n")
        time.sleep(600)
    """,
    )
    previous = signal.getsignal(signal.SIGTERM)

    def sigterm(record):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this

    with pytest.raises(KeyboardInterrupt):
        supervise.run_plan(plan, live=False, on_record=sigterm, poll_seconds=0.02)
    assert signal.getsignal(signal.SIGTERM) is previous  # restored after the run
    child = int(pids.read_text())

    def gone() -> bool:  # a zombie awaiting its reaper counts as gone
        try:
            with open(f"/proc/{child}/stat") as stat:
                return stat.read().split(")")[-1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    deadline = time.time() + 20
    while not gone() and time.time() < deadline:
        time.sleep(0.1)
    assert gone(), "the training process was left running"
