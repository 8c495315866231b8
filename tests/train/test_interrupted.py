"""Ctrl-C is always recoverable by the command the message prints; --resume names its step."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from trnfrontier.errors import TrnfError
from trnfrontier.recipes.loading import load_recipe
from trnfrontier.runtime import checkpoint as ck
from trnfrontier.runtime.integrity import write_manifest
from trnfrontier.train import plan as planning
from trnfrontier.train import supervise
from trnfrontier.train.interrupted import restartable, resume_note, stop_message

REPO = Path(__file__).resolve().parents[2]

# A stand-in worker: logs one step, then works until it is stopped (no checkpoint yet).
_WORKER = """
import json, sys, time
from pathlib import Path
run = Path(sys.argv[1])
with open(run / "metrics.jsonl", "a") as m:
    m.write(json.dumps({"step": 1, "loss": 9.0, "lr": 0.1, "charged_seconds": 1}) + "\\n")
time.sleep(600)
"""


@pytest.fixture(autouse=True)
def _project_prepare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRNF_PREPARE", str(REPO / "prepare.py"))


def _interrupted_run(tmp_path: Path) -> Path:
    """What Ctrl-C during startup leaves: a run directory with no checkpoint."""
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(_WORKER))
    plan = planning.plan_new_run("cpu_smoke", [], out=tmp_path / "run")
    plan.command = [sys.executable, str(worker), str(plan.run_dir)]

    def interrupt(record: dict) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        supervise.run_plan(plan, live=False, on_record=interrupt, poll_seconds=0.02)
    return plan.run_dir


def _add_checkpoint(run: Path, step: int) -> None:
    folder = run / "checkpoints" / f"step_{step:06d}"
    folder.mkdir(parents=True)
    for name in (ck.MODEL_FILE, ck.OPTIM_FILE, ck.STATE_FILE):
        (folder / name).write_text("{}")
    (folder / ck.META_FILE).write_text(json.dumps({"step": step, "charged_seconds": 312.4}))
    write_manifest(folder)  # as every checkpoint trnf writes has (a resume refuses one without)


def test_ctrl_c_before_the_first_checkpoint_suggests_a_rerun_that_works(sample_home: Path, tmp_path: Path) -> None:
    run = _interrupted_run(tmp_path)
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    message = stop_message(run, f"trnf train cpu_smoke --out {run}")
    assert "nothing to resume" in message and f"`trnf train cpu_smoke --out {run}`" in message
    assert "--resume" not in message

    # The suggested command is accepted into the same folder, and starts clean there
    # (the ledger's provenance.json, which `trnf train` writes first, is no obstacle).
    (run / "provenance.json").write_text("{}")
    assert restartable(run)
    plan = planning.plan_new_run("cpu_smoke", [], out=run)
    assert plan.replaces and not plan.resume
    plan.command = [sys.executable, "-c", "pass"]
    supervise.run_plan(plan, live=False, poll_seconds=0.02)
    assert not (run / "metrics.jsonl").exists()  # the stopped run's step 1 is gone
    assert json.loads((run / "recipe.json").read_text())["name"] == "cpu_smoke"


def test_ctrl_c_after_a_checkpoint_suggests_resume_from_its_step(sample_home: Path, tmp_path: Path) -> None:
    run = _interrupted_run(tmp_path)
    _add_checkpoint(run, 40)
    message = stop_message(run, "unused")
    assert f"`trnf train --resume {run}`" in message and "step 40" in message
    assert not restartable(run)  # a run with a checkpoint is resumed, never replaced
    with pytest.raises(TrnfError, match="--resume"):
        planning.plan_new_run("cpu_smoke", [], out=run)
    assert resume_note(run) == f"resuming {run} from checkpoints/step_000040 (step 40, 312 s of the budget charged)"


def test_the_stop_message_says_how_many_steps_a_resume_repeats(sample_home: Path, tmp_path: Path) -> None:
    """No time for a checkpoint of the step in progress (a second Ctrl-C): the steps since
    the newest checkpoint are done again, and the message says how many."""
    run = _interrupted_run(tmp_path)
    _add_checkpoint(run, 40)
    log = run / "step_boundaries.jsonl"
    log.write_text(json.dumps({"header": True, "start_time": 1.0}) + "\n" + "".join(
        json.dumps({"step": i, "time": 2.0 + i}) + "\n" for i in range(40)))
    assert stop_message(run, "unused") == (
        f"training stopped at step 40; its checkpoint checkpoints/step_000040 (step 40) holds every step done: "
        f"continue with `trnf train --resume {run}`"
    )
    with open(log, "a") as handle:
        handle.write("".join(json.dumps({"step": i, "time": 2.0 + i}) + "\n" for i in range(40, 47)))
    assert stop_message(run, "unused") == (
        f"training stopped at step 47; the newest checkpoint is checkpoints/step_000040 (step 40), "
        f"so `trnf train --resume {run}` repeats 7 steps"
    )
    shutil.rmtree(run / "checkpoints")
    assert "nothing to resume (47 steps done are lost); start it again with `again`" in stop_message(run, "again")


def test_a_live_run_without_a_summary_is_never_replaced(sample_home: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.json").write_text(json.dumps(load_recipe("cpu_smoke").model_dump(mode="json")))
    (run / "metrics.jsonl").write_text("")
    assert not restartable(run)


def test_trnf_train_ctrl_c_prints_the_rerun_line(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(plan: planning.RunPlan, **_: object) -> dict:
        plan.run_dir.mkdir(parents=True, exist_ok=True)  # trnf train wrote provenance.json there
        raise KeyboardInterrupt

    monkeypatch.setattr(supervise, "run_plan", interrupted)
    run = tmp_path / "r"
    code, _, err = run_cli(["train", "cpu_smoke", "optim.matrix_lr=0.03", "--out", str(run)], capsys)
    assert code == 130
    assert f"start it again with `trnf train cpu_smoke optim.matrix_lr=0.03 --out {run}`" in err


def test_trnf_train_resume_says_which_step_and_checkpoint(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _interrupted_run(tmp_path)
    _add_checkpoint(run, 40)

    def interrupted(plan: planning.RunPlan, **_: object) -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr(supervise, "run_plan", interrupted)
    code, _, err = run_cli(["train", "--resume", str(run)], capsys)
    assert code == 130
    assert f"resuming {run} from checkpoints/step_000040 (step 40, 312 s of the budget charged)" in err
    assert f"continue it from checkpoints/step_000040 (step 40) with `trnf train --resume {run}`" in err


def test_the_final_evaluation_phase_is_shown(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Minutes of final evaluation add nothing to metrics.jsonl; the worker's announcement
    in train.log is what trnf train shows (a plain line when stderr is not a terminal)."""
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent("""
        import json, sys, time
        from pathlib import Path
        run = Path(sys.argv[1])
        with open(run / "metrics.jsonl", "a") as m:
            m.write(json.dumps({"step": 1, "loss": 9.0, "lr": 0.1, "charged_seconds": 1}) + "\\n")
        print("final evaluation: 2,048 tokens, the trusted evaluate_bpb of final", flush=True)
        time.sleep(0.5)
        (run / "summary.json").write_text(json.dumps({"status": "completed", "val_bpb": 1.5}))
    """))
    plan = planning.plan_new_run("cpu_smoke", [], out=tmp_path / "run")
    plan.command = [sys.executable, str(worker), str(plan.run_dir)]
    supervise.run_plan(plan, live=True, poll_seconds=0.05)
    err = capsys.readouterr().err
    assert "final evaluation: 2,048 tokens" in err
    assert err.index("step 1  loss 9.0000") < err.index("final evaluation:")  # in the order they happened
    watch = supervise.PhaseWatch(plan.run_dir / "train.log")
    assert watch.read() == []  # only lines written after it started count


def _stand_in(tmp_path: Path, body: str) -> Path:
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent("""
        import json, sys, time
        from pathlib import Path
        run = Path(sys.argv[1])
        def record(step, **extra):
            with open(run / "metrics.jsonl", "a") as m:
                m.write(json.dumps({"step": step, "loss": 9.0, "lr": 0.1, "charged_seconds": step, **extra}) + "\\n")
    """) + textwrap.dedent(body))
    return worker


def test_the_compile_is_a_phase_with_its_elapsed_time(
    sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outside's case: nothing reached the console during the first step's compile
    (77-236 s); the note went only to train.log. Off a terminal, the phase line comes at
    once and, while nothing new comes, again with the time so far."""
    monkeypatch.setattr(supervise, "PLAIN_QUIET_SECONDS", 0.3)
    worker = _stand_in(tmp_path, """
        print("compiling: the first step compiles the training step (torch.compile; cache /c)", flush=True)
        time.sleep(1.5)
        print("first step 1.5 s (includes torch.compile)", flush=True)
        record(1, startup=True)
        time.sleep(0.3)
        (run / "summary.json").write_text(json.dumps({"status": "completed", "val_bpb": 1.5}))
    """)
    plan = planning.plan_new_run("cpu_smoke", [], out=tmp_path / "run")
    plan.command = [sys.executable, str(worker), str(plan.run_dir)]
    supervise.run_plan(plan, live=True, poll_seconds=0.05)
    lines = capsys.readouterr().err.splitlines()
    compiling = [i for i, line in enumerate(lines) if line.startswith("compiling: the first step compiles")]
    assert compiling and any(line.endswith("s so far)") for line in lines[compiling[0] + 1:]), lines
    assert lines.index("first step 1.5 s (includes torch.compile)") > compiling[-1]
    assert any(line.startswith("step 1  loss 9.0000") and line.endswith("(startup, not charged)") for line in lines)


def test_a_resumed_run_shows_its_steps(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The outside's case: after --resume the console showed no step lines (the trainer cuts
    metrics.jsonl back to its checkpoint, and the tail waited past the old end)."""
    run = _interrupted_run(tmp_path)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 5.0, "lr": 0.1}) + "\n" for s in range(1, 31)))
    _add_checkpoint(run, 20)
    worker = _stand_in(tmp_path, """
        from trnfrontier.runtime.metrics import truncate_after
        truncate_after(run / "metrics.jsonl", 20)  # what the resumed trainer does first
        for step in (21, 22):
            record(step)
        (run / "summary.json").write_text(json.dumps({"status": "completed", "val_bpb": 1.5}))
    """)
    plan = planning.plan_resume(run, [])
    plan.command = [sys.executable, str(worker), str(run)]
    supervise.run_plan(plan, live=True, poll_seconds=0.05)
    assert "step 22  loss 9.0000  charged 22/" in capsys.readouterr().err
