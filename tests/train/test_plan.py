"""trnfrontier/train/plan.py: planning a `trnf train` run, its refusals, the launch command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.recipes.loading import load_recipe
from trnfrontier.runtime import checkpoint as ck
from trnfrontier.runtime.integrity import write_manifest
from trnfrontier.train import plan as planning

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _project_prepare(monkeypatch) -> None:
    monkeypatch.setenv("TRNF_PREPARE", str(REPO / "prepare.py"))


# ---------------------------------------------------------------------------- planning


def test_new_run_goes_to_runs_name(sample_home, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    plan = planning.plan_new_run("cpu_smoke", ["optim.matrix_lr=0.03"])
    assert plan.run_dir == Path("runs/cpu_smoke") and not plan.resume
    assert plan.recipe.optim.matrix_lr == 0.03
    assert plan.command[1:4] == ["-m", "trnfrontier.train.worker", "--recipe"]
    assert not plan.run_dir.exists()  # planning writes nothing
    assert planning.plan_new_run("cpu_smoke", [], name="exp2").run_dir == Path("runs/exp2")
    assert planning.plan_new_run("cpu_smoke", [], out=tmp_path / "x").run_dir == tmp_path / "x"


def test_existing_run_dir_is_refused_and_untouched(sample_home, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("precious\n")
    with pytest.raises(TrnfError) as info:
        planning.plan_new_run("cpu_smoke", [], out=run)
    # No checkpoint in it: --resume would find nothing, so it is not what the message offers.
    assert info.value.exit_code == 2 and "--name" in str(info.value)
    assert f"run directory {run} already exists and is not a run directory" in str(info.value)
    assert "--resume" not in str(info.value)
    assert (run / "metrics.jsonl").read_text() == "precious\n"
    planning.plan_new_run("cpu_smoke", [], out=tmp_path / "empty_is_fine")


def test_out_and_name_are_exclusive(sample_home, tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        planning.plan_new_run("cpu_smoke", [], out=tmp_path / "a", name="b")


def test_nproc_sets_runtime_nproc_and_uses_torchrun(sample_home, tmp_path: Path) -> None:
    plan = planning.plan_new_run("cpu_smoke", [], out=tmp_path / "r", nproc=2)
    assert plan.recipe.runtime.nproc == 2
    assert plan.command[1:6] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
    ]
    assert plan.command[6:8] == ["-m", "trnfrontier.train.worker"]


def test_nproc_that_breaks_the_batch_geometry_names_the_key(sample_home, tmp_path: Path) -> None:
    with pytest.raises(TrnfError, match="data.total_batch_tokens"):
        planning.plan_new_run(
            "cpu_smoke", ["data.total_batch_tokens=8192"], out=tmp_path / "r", nproc=3
        )


def test_neuron_launch_env_sets_the_logical_core_config() -> None:
    recipe = load_recipe("baseline_d10", ["runtime.lnc=1"])
    env = planning.launch_env(recipe)
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "1"
    assert env["TRNF_PREPARE"] == str(REPO / "prepare.py")
    assert "NEURON_LOGICAL_NC_CONFIG" not in planning.launch_env(load_recipe("cpu_smoke"))


def test_training_ranks_start_with_faulthandler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONFAULTHANDLER", raising=False)
    assert planning.launch_env(load_recipe("cpu_smoke"))["PYTHONFAULTHANDLER"] == "1"


def test_vocab_mismatch_with_the_tokenizer_is_refused(sample_home) -> None:
    with pytest.raises(TrnfError) as info:
        planning.check_can_train(load_recipe("cpu_smoke", ["model.vocab_size=4096"]))
    assert "model.vocab_size=4096" in str(info.value) and "8192" in str(info.value)


def test_missing_dataset_says_run_trnf_prepare(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "empty_home"))
    monkeypatch.delenv("TRNF_DATASET", raising=False)
    with pytest.raises(TrnfError, match="trnf prepare"):
        planning.check_can_train(load_recipe("cpu_smoke"))


def test_neuron_without_torch_neuronx_is_refused_before_launch(sample_home, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch_neuronx" else real(name, *a),
    )
    with pytest.raises(TrnfError) as info:
        planning.check_can_train(load_recipe("baseline_d10"))
    assert "torch-neuronx" in str(info.value) and "pip.repos.neuron.amazonaws.com" in str(
        info.value
    )


def test_extras_must_be_overrides() -> None:
    assert planning.split_overrides(["a.b=1"]) == ["a.b=1"]
    with pytest.raises(UsageError, match="unknown option"):
        planning.split_overrides(["--fast"])
    with pytest.raises(UsageError, match="key.path=value"):
        planning.split_overrides(["recipes/other.yaml"])


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
        write_manifest(step)  # as every checkpoint trnf writes has (a resume refuses one without)
    if status:
        (run / "summary.json").write_text(json.dumps({"status": status}))
    return run


def test_resume_plan(sample_home, tmp_path: Path) -> None:
    run = _fake_run(tmp_path, status="crashed")
    plan = planning.plan_resume(run, [])
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
        planning.plan_resume(setup(tmp_path), [])
    assert info.value.exit_code == 2


def test_resume_refuses_overrides_and_other_nproc(sample_home, tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    with pytest.raises(UsageError, match="overrides"):
        planning.plan_resume(run, ["optim.matrix_lr=1"])
    with pytest.raises(UsageError, match="same process count"):
        planning.plan_resume(run, [], nproc=4)


def test_resume_with_a_corrupt_recipe_json(sample_home, tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    (run / "recipe.json").write_text("{not json")
    with pytest.raises(TrnfError, match="unreadable"):
        planning.plan_resume(run, [])


def test_no_dataset_names_the_root_and_the_variable_that_chose_it(
    sample_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outside's case: NEURON_COMPETITION_R1_CACHE_DIR and TRNF_HOME both set; trnf
    looked under the kit's folder in silence while the data was prepared under TRNF_HOME."""
    kit = tmp_path / "kit-cache"
    kit.mkdir()
    monkeypatch.setenv("NEURON_COMPETITION_R1_CACHE_DIR", str(kit))
    monkeypatch.delenv("TRNF_DATASET")
    recipe = load_recipe("cpu_smoke")
    with pytest.raises(TrnfError) as info:
        planning.check_can_train(recipe)
    assert str(info.value) == (
        f"no prepared dataset to train on under {kit} (the data root, chosen by $NEURON_COMPETITION_R1_CACHE_DIR "
        f"(it wins over $TRNF_HOME={sample_home})); the datasets prepared under {sample_home} are used once "
        "NEURON_COMPETITION_R1_CACHE_DIR is unset"
    )
    monkeypatch.delenv("TRNF_HOME")  # nothing hidden: prepare.py's own words, and where it looked
    with pytest.raises(TrnfError) as info:
        planning.check_can_train(recipe)
    assert f"no prepared dataset under {kit}" in str(info.value)
    assert str(info.value).endswith(f"(data root {kit}, chosen by $NEURON_COMPETITION_R1_CACHE_DIR)")


def test_help_states_the_data_root_order(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.cli_run import run_cli

    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    assert "$NEURON_COMPETITION_R1_CACHE_DIR when set (the kit's variable wins), else this, else ~/.cache/trnfrontier" in " ".join(
        line.strip("│ ") for line in out.splitlines()
    )


@pytest.mark.parametrize("summary, checkpoint, said, resume", [
    ({"status": "completed", "val_bpb": 2.734186}, True, "holds a run that completed (val_bpb 2.734186)", False),
    ({"status": "crashed"}, True, "holds a run that stopped (crashed) with a checkpoint to continue from", True),
    ({"status": "crashed"}, False, "holds a run that stopped (crashed) before its first checkpoint", False),
])
def test_an_occupied_run_dir_says_what_it_holds_and_the_step_that_works(
    sample_home, tmp_path: Path, summary: dict, checkpoint: bool, said: str, resume: bool
) -> None:
    """The outside's case: re-running a finished run's command suggested --resume, which
    then said the run had already completed."""
    run = _fake_run(tmp_path, checkpoint=checkpoint)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "provenance.json").write_text("{}")
    (run / "train.log").write_text("kept\n")
    if not checkpoint:  # a stopped run with no checkpoint and an extra file is not restartable
        (run / "notes.txt").write_text("mine")
    with pytest.raises(TrnfError) as info:
        planning.plan_new_run("cpu_smoke", [], out=run)
    message = str(info.value)
    assert message.startswith(f"run directory {run} {said}; nothing was changed. Choose another with --name NAME (or --out DIR)")
    assert ("--resume" in message) == resume
