"""The `trnf train` library (trnfrontier/training.py): planning and refusals, the launch command, following the child.

(Named test_training_lib.py: tests/kernels/test_training.py has the basename test_training.)
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trnfrontier import training
from trnfrontier.cli.train_view import summary_table
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.recipes.loading import load_recipe
from trnfrontier.runtime import checkpoint as ck

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _project_prepare(monkeypatch) -> None:
    monkeypatch.setenv("TRNF_PREPARE", str(REPO / "prepare.py"))


# ---------------------------------------------------------------------------- planning


def test_new_run_goes_to_runs_name(sample_home, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    plan = training.plan_new_run("cpu_smoke", ["optim.matrix_lr=0.03"])
    assert plan.run_dir == Path("runs/cpu_smoke") and not plan.resume
    assert plan.recipe.optim.matrix_lr == 0.03
    assert plan.command[1:4] == ["-m", "trnfrontier.train_worker", "--recipe"]
    assert not plan.run_dir.exists()  # planning writes nothing
    assert training.plan_new_run("cpu_smoke", [], name="exp2").run_dir == Path("runs/exp2")
    assert training.plan_new_run("cpu_smoke", [], out=tmp_path / "x").run_dir == tmp_path / "x"


def test_existing_run_dir_is_refused_and_untouched(sample_home, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("precious\n")
    with pytest.raises(TrnfError) as info:
        training.plan_new_run("cpu_smoke", [], out=run)
    # No checkpoint in it: --resume would find nothing, so it is not what the message offers.
    assert info.value.exit_code == 2 and "--name" in str(info.value) and "remove it" in str(info.value)
    assert "--resume" not in str(info.value)
    assert (run / "metrics.jsonl").read_text() == "precious\n"
    training.plan_new_run("cpu_smoke", [], out=tmp_path / "empty_is_fine")


def test_out_and_name_are_exclusive(sample_home, tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        training.plan_new_run("cpu_smoke", [], out=tmp_path / "a", name="b")


def test_nproc_sets_runtime_nproc_and_uses_torchrun(sample_home, tmp_path: Path) -> None:
    plan = training.plan_new_run("cpu_smoke", [], out=tmp_path / "r", nproc=2)
    assert plan.recipe.runtime.nproc == 2
    assert plan.command[1:6] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    assert plan.command[6:8] == ["-m", "trnfrontier.train_worker"]


def test_nproc_that_breaks_the_batch_geometry_names_the_key(sample_home, tmp_path: Path) -> None:
    with pytest.raises(TrnfError, match="data.total_batch_tokens"):
        training.plan_new_run(
            "cpu_smoke", ["data.total_batch_tokens=8192"], out=tmp_path / "r", nproc=3
        )


def test_neuron_launch_env_sets_the_logical_core_config() -> None:
    recipe = load_recipe("baseline_d10", ["runtime.lnc=1"])
    env = training.launch_env(recipe)
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert env["TRNF_PREPARE"] == str(REPO / "prepare.py")
    assert "NEURON_LOGICAL_NC_CONFIG" not in training.launch_env(load_recipe("cpu_smoke"))


def test_training_ranks_start_with_faulthandler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONFAULTHANDLER", raising=False)
    assert training.launch_env(load_recipe("cpu_smoke"))["PYTHONFAULTHANDLER"] == "1"


def test_vocab_mismatch_with_the_tokenizer_is_refused(sample_home) -> None:
    with pytest.raises(TrnfError) as info:
        training.check_can_train(load_recipe("cpu_smoke", ["model.vocab_size=4096"]))
    assert "model.vocab_size=4096" in str(info.value) and "8192" in str(info.value)


def test_missing_dataset_says_run_trnf_prepare(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "empty_home"))
    monkeypatch.delenv("TRNF_DATASET", raising=False)
    with pytest.raises(TrnfError, match="trnf prepare"):
        training.check_can_train(load_recipe("cpu_smoke"))


def test_neuron_without_torch_neuronx_is_refused_before_launch(sample_home, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch_neuronx" else real(name, *a),
    )
    with pytest.raises(TrnfError) as info:
        training.check_can_train(load_recipe("baseline_d10"))
    assert "torch-neuronx" in str(info.value) and "pip.repos.neuron.amazonaws.com" in str(
        info.value
    )


def test_extras_must_be_overrides() -> None:
    assert training.split_overrides(["a.b=1"]) == ["a.b=1"]
    with pytest.raises(UsageError, match="unknown option"):
        training.split_overrides(["--fast"])
    with pytest.raises(UsageError, match="key.path=value"):
        training.split_overrides(["recipes/other.yaml"])


# ---------------------------------------------------------------------------- resume planning


def _fake_run(tmp_path: Path, *, checkpoint: bool = True, status: str | None = None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    recipe = load_recipe("cpu_smoke")
    (run / "recipe.json").write_text(json.dumps(recipe.model_dump(mode="json")))
    if checkpoint:
        step = run / "checkpoints" / "step_000004"
        step.mkdir(parents=True)
        for name in (ck.MODEL_FILE, ck.META_FILE, ck.OPTIM_FILE, ck.STATE_FILE):
            (step / name).write_text("{}")
    if status:
        (run / "summary.json").write_text(json.dumps({"status": status}))
    return run


def test_resume_plan(sample_home, tmp_path: Path) -> None:
    run = _fake_run(tmp_path, status="crashed")
    plan = training.plan_resume(run, [])
    assert plan.resume and plan.command[-1] == "--resume" and plan.recipe.name == "cpu_smoke"


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda p: p / "nowhere", "no such directory"),
        (lambda p: (p / "plain").mkdir() or p / "plain", "not a run directory"),
        (lambda p: _fake_run(p, checkpoint=False), "no complete checkpoint"),
        (lambda p: _fake_run(p, status="completed"), "already completed"),
    ],
)
def test_resume_refusals(sample_home, tmp_path: Path, setup, match: str) -> None:
    with pytest.raises(TrnfError, match=match) as info:
        training.plan_resume(setup(tmp_path), [])
    assert info.value.exit_code == 2


def test_resume_refuses_overrides_and_other_nproc(sample_home, tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    with pytest.raises(UsageError, match="overrides"):
        training.plan_resume(run, ["optim.matrix_lr=1"])
    with pytest.raises(UsageError, match="same process count"):
        training.plan_resume(run, [], nproc=4)


def test_resume_with_a_corrupt_recipe_json(sample_home, tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    (run / "recipe.json").write_text("{not json")
    with pytest.raises(TrnfError, match="unreadable"):
        training.plan_resume(run, [])


# ---------------------------------------------------------------------------- following the child


def test_metrics_tail_waits_for_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = training.MetricsTail(path)
    assert tail.read() == []
    with open(path, "w") as handle:
        handle.write('{"step": 1}\n{"step": 2')
    assert tail.read() == [{"step": 1}]
    with open(path, "a") as handle:
        handle.write("}\n")
    assert tail.read() == [{"step": 2}]


def _plan_with(tmp_path: Path, script: str) -> training.RunPlan:
    code = tmp_path / "child.py"
    code.write_text(textwrap.dedent(script))
    run = tmp_path / "run"
    return training.RunPlan(
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
    summary = training.run_plan(plan, live=False, on_record=seen.append, poll_seconds=0.02)
    assert (
        summary["status"] == "completed" and summary["val_bpb"] == 1.5 and summary["exit_code"] == 0
    )
    assert [r["step"] for r in seen] == [1, 2, 3]
    assert "child output goes to train.log" in (plan.run_dir / "train.log").read_text()
    assert training.failure_message(summary, plan.run_dir) is None


def test_a_child_that_dies_without_a_summary_is_recorded_as_crashed(tmp_path: Path) -> None:
    plan = _plan_with(
        tmp_path,
        """
        import sys
        raise SystemExit("boom: out of memory")
    """,
    )
    summary = training.run_plan(plan, live=False, poll_seconds=0.02)
    assert summary["status"] == "crashed" and summary["exit_code"] == 1
    assert json.loads((plan.run_dir / "summary.json").read_text())["status"] == "crashed"
    message = training.failure_message(summary, plan.run_dir)
    assert "train.log" in message and "\n" not in message
    assert "boom: out of memory" in training.tail_log(plan.run_dir)


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
        training.run_plan(plan, live=False, on_record=interrupt, poll_seconds=0.02)
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
    message = training.failure_message(
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
    console.print(training.live_view(None, 120.0, tmp_path, time.time(), None))
    record = {
        "step": 12,
        "loss": 5.4321,
        "lr": 0.02,
        "tokens_per_second": 12345.0,
        "mfu": 0.31,
        "charged_seconds": 30.0,
        "startup": False,
    }
    console.print(training.live_view(record, 120.0, tmp_path, time.time(), 1.2345))
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
        training.run_plan(plan, live=False, on_record=sigterm, poll_seconds=0.02)
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
