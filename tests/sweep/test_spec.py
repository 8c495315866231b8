"""The sweep spec, its search space as trial words, and a trial's reading of its run
directory (no Ray: these run in the quick suite)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from tests.cli_run import run_cli
from trnfrontier.errors import TrnfError
from trnfrontier.sweep.driver import check_environment
from trnfrontier.sweep.space import params_of, train_words
from trnfrontier.sweep.spec import SweepSpec, override, read_spec, scalar
from trnfrontier.sweep.trial import (
    Job,
    Reporter,
    error_line,
    mean_loss,
    metric_value,
    plan_words,
    progress,
    shared_checkpoint,
)

REPO = Path(__file__).resolve().parents[2]


def _spec(tmp_path: Path, body: dict) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "recipe": "cpu_smoke", **body}), encoding="utf-8")
    return path


def test_the_shipped_example_spec_is_valid() -> None:
    for path in sorted((REPO / "sweeps").glob("*.yaml")):
        spec = read_spec(path)
        assert spec.expected_trials() >= 2


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"space": {"optim.matrix_lr": {"grid": [0.01]}}, "concurency": 2}, "concurency: unknown key (did you mean 'concurrency'?"),
        ({"space": {"optim.matrix_lr": {"grid": [0.01], "uniform": [0, 1]}}}, "space.'optim.matrix_lr': give exactly one of"),
        ({"space": {"optim.matrix_lr": {"loguniform": [0, 1]}}, "search": "random", "trials": 2}, "loguniform: low 0.0 must be above 0"),
        ({"space": {"optim.matrix_lr": {"uniform": [0.01, 0.1]}}}, "search: grid tries listed values; space.optim.matrix_lr is uniform"),
        ({"space": {"optim.matrix_lr": {"grid": [0.01, 0.1]}}, "search": "optuna", "trials": 3}, "space.optim.matrix_lr is grid: write it as choice"),
        ({"space": {"optim.matrix_lr": {"choice": [0.01, 0.1]}}, "search": "random"}, "trials: search: random needs"),
        ({"space": {"optim.matrx_lr": {"grid": [0.01]}}}, "space.optim.matrx_lr = 0.01:"),
        ({"space": {"optim.matrix_lr": {"grid": [0.01, -1.0]}}}, "space.optim.matrix_lr = -1.0:"),
        ({"space": {"optim.matrix_lr": {"grid": [0.01]}}, "concurrency": 0}, "concurrency: Input should be greater than or equal to 1"),
        ({"space": {}}, "space: nothing to vary"),
        ({"seeds": [1, 2], "core_args": ["--max-per-task", "5"]}, "core_args: flags of the CORE evaluation, for metric: core"),
        ({"space": {"optim.matrix_lr": {"grid": [0.01]}}, "resources": {"neuron_cores": "two"}}, "resources.neuron_cores:"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_key(tmp_path: Path, body: dict, expected: str) -> None:
    with pytest.raises(TrnfError) as caught:
        read_spec(_spec(tmp_path, body))
    message = str(caught.value)
    assert expected in message and "\n" not in message


def test_a_spec_error_through_the_cli_starts_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = _spec(tmp_path, {"space": {"optim.matrix_lr": {"grid": [0.01, "fast"]}}})
    code, out, err = run_cli(["sweep", str(path), "--out", str(tmp_path / "sw")], capsys)
    assert code == 2 and out == ""
    assert err.startswith("trnf: error: ") and "space.optim.matrix_lr = 'fast'" in err and err.count("\n") == 1
    assert not (tmp_path / "sw").exists()


def test_trial_words_are_overrides_that_read_back_as_the_values() -> None:
    assert scalar(1e-5) == "1.0e-05" and yaml.safe_load(scalar(1e-5)) == 1e-5
    assert override("model.depth", 2) == "model.depth=2"
    spec = SweepSpec.model_validate({
        "name": "s", "recipe": "cpu_smoke", "overrides": ["budget.max_steps=3"], "seeds": [1, 2],
        "space": {"optim.matrix_lr": {"grid": [0.01, 0.02]}},
    })  # fmt: skip
    assert spec.expected_trials() == 4
    params = params_of(spec, {"optim.matrix_lr": 0.02, "runtime.seed": 2, "unrelated": 1})
    assert params == {"optim.matrix_lr": 0.02, "runtime.seed": 2}
    words = train_words(spec, params, "runs/x/t0")
    assert words == ["cpu_smoke", "budget.max_steps=3", "optim.matrix_lr=0.02", "runtime.seed=2", "--out", "runs/x/t0"]


def test_kit_trials_pass_the_swept_values_as_the_scripts_flags(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    spec = SweepSpec.model_validate({
        "name": "k", "train_py": str(script), "args": ["--no-compile"], "nproc": 2,
        "space": {"--matrix-lr": {"choice": [0.01, 0.02]}}, "search": "random", "trials": 2,
    })  # fmt: skip
    words = train_words(spec, {"--matrix-lr": 0.02}, "runs/k/t0")
    assert words == ["--train-py", str(script), "--nproc", "2", "--out", "runs/k/t0", "--", "--no-compile", "--matrix-lr", "0.02"]
    with pytest.raises(ValueError, match="seeds: a kit train.py"):
        SweepSpec.model_validate({"name": "k", "train_py": str(script), "seeds": [1, 2], "space": {}})
    with pytest.raises(ValueError, match="early_stop: a kit train.py reports no training loss"):
        SweepSpec.model_validate({"name": "k", "train_py": str(script), "space": {}, "early_stop": {"grace_period": 0.25}})


def test_kit_trials_run_at_once_each_into_its_own_folder(tmp_path: Path) -> None:
    """concurrency > 1 with a train_py: each trial writes into its own run directory through
    NEURON_COMPETITION_R1_OUT_DIR, so a fixed --out-dir (args, space) or the variable set
    by the user, which would send every trial to one folder, is refused; at concurrency 1
    they are the user's to choose."""
    script = tmp_path / "train.py"
    script.write_text("")
    base = {"name": "k", "train_py": str(script), "space": {"--lr": {"grid": [1, 2]}}}
    spec = SweepSpec.model_validate({**base, "concurrency": 2})
    check_environment(spec, {})
    with pytest.raises(TrnfError, match="NEURON_COMPETITION_R1_OUT_DIR is set .*unset it .* or set concurrency: 1"):
        check_environment(spec, {"NEURON_COMPETITION_R1_OUT_DIR": "/shared/out"})
    for extra, where in (({"args": ["--out-dir=/x"]}, "args"), ({"args": ["--out-dir", "/x"]}, "args"),
                         ({"space": {"--out-dir": {"grid": ["a", "b"]}}}, "space.--out-dir")):
        with pytest.raises(ValueError, match=f"{where}: --out-dir would send trials running at once into one folder"):
            SweepSpec.model_validate({**base, **extra, "concurrency": 2})
        alone = SweepSpec.model_validate({**base, **extra, "concurrency": 1})
        check_environment(alone, {"NEURON_COMPETITION_R1_OUT_DIR": "/shared/out"})


def test_a_kit_trial_whose_script_ignores_its_folder_fails_only_when_trials_run_at_once(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    base = {"name": "k", "train_py": str(script), "space": {"--lr": {"grid": [1, 2]}}}
    ignored = {"status": "completed", "out_dir_ignored": True, "final_checkpoint": str(tmp_path / "out" / "final.pt")}
    at_once = SweepSpec.model_validate({**base, "concurrency": 2})
    line = shared_checkpoint(at_once, ignored)
    assert line is not None and "train.py ignores NEURON_COMPETITION_R1_OUT_DIR" in line and line.endswith("concurrency: 1")
    assert shared_checkpoint(at_once, {**ignored, "out_dir_ignored": False}) is None
    assert shared_checkpoint(SweepSpec.model_validate({**base, "concurrency": 1}), ignored) is None


def test_an_interrupted_kit_trial_starts_again_and_a_completed_one_is_not_repeated(tmp_path: Path) -> None:
    """`trnf sweep --resume`: a kit script owns its checkpoints, so an interrupted kit trial
    is cleared (its out/final.pt too) and run from scratch; a completed one is not run."""
    script = tmp_path / "train.py"
    script.write_text("")
    spec = SweepSpec.model_validate({"name": "k", "train_py": str(script), "concurrency": 2, "space": {"--lr": {"grid": [1, 2]}}})
    job = Job("sweep-1", str(tmp_path / "sw"), spec, str(tmp_path))
    run_dir = job.run_dir("t0")
    (run_dir / "out").mkdir(parents=True)
    (run_dir / "out" / "final.pt").write_bytes(b"x")
    (run_dir / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    assert plan_words(job, {"--lr": 1}, run_dir) == ["train", *train_words(spec, {"--lr": 1}, str(run_dir))]
    assert not run_dir.exists()
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    assert plan_words(job, {"--lr": 1}, run_dir) is None


def test_progress_is_steps_or_charged_time_whichever_is_ahead() -> None:
    assert progress({"step": 3, "charged_seconds": 1.0}, {"max_steps": 12, "seconds": 120}) == 0.25
    assert progress({"step": 3, "charged_seconds": 60.0}, {"max_steps": 12, "seconds": 120}) == 0.5
    assert progress({"step": 3, "charged_seconds": 30.0}, {"max_steps": None, "seconds": 120}) == 0.25
    assert mean_loss([{"loss": 2.0}, {"loss": 4.0}]) == 3.0
    assert mean_loss([{"loss": 2.0}, {"loss": None}]) == math.inf  # a NaN logged as null
    assert mean_loss([]) == math.inf


def test_the_reporter_reports_at_each_fraction_and_the_result_last(tmp_path: Path) -> None:
    (tmp_path / "recipe.json").write_text(json.dumps({"budget": {"max_steps": 8, "seconds": 1000}}))
    sent: list[dict] = []
    reporter = Reporter(tmp_path, 4, sent.append)
    with open(tmp_path / "metrics.jsonl", "w") as metrics:
        for step in range(1, 7):
            metrics.write(json.dumps({"step": step, "loss": 10.0 - step, "charged_seconds": 0.0}) + "\n")
    reporter.poll()
    assert [r["fraction"] for r in sent] == [0.25, 0.5, 0.75]
    assert [r["train_loss"] for r in sent] == [8.5, 6.5, 4.5]  # the mean over each stretch
    with open(tmp_path / "metrics.jsonl", "a") as metrics:
        for step in (7, 8):
            metrics.write(json.dumps({"step": step, "loss": 10.0 - step, "charged_seconds": 0.0}) + "\n")
    reporter.finish(val_bpb=1.5)  # the run ended: its last stretch and its result, as 4/4
    assert sent[-1] == {"train_loss": 2.5, "fraction": 1.0, "val_bpb": 1.5} and len(sent) == 4


def test_a_trial_reads_its_result_and_its_error_from_its_run_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = tmp_path / "trial.log"
    log.write_text("$ trnf train ...\ntrnf: error: no prepared dataset to train on: 'x'\n")
    assert metric_value(run, "val_bpb") is None
    assert error_line(run, log) == "no prepared dataset to train on: 'x'"
    (run / "summary.json").write_text(json.dumps({"status": "crashed", "error": "RuntimeError: boom", "val_bpb": None}))
    assert error_line(run, log) == "RuntimeError: boom"
    (run / "summary.json").write_text(json.dumps({"status": "completed", "val_bpb": 1.25}))
    assert metric_value(run, "val_bpb") == 1.25
    (run / "scores.jsonl").write_text(json.dumps({"core": 0.2}) + "\n")
    assert metric_value(run, "core") == 0.2


def test_a_trial_that_fails_a_completed_run_keeps_its_own_error_line(tmp_path: Path) -> None:
    """The run's summary says completed, yet the trial fails it (a kit script that ignored
    its folder, trials at once; a run without its metric): the driver records the trial's
    own line, not one made up from the run directory."""
    from types import SimpleNamespace

    from trnfrontier.sweep import state as st
    from trnfrontier.sweep.engine import _error_of
    from trnfrontier.sweep.report import rows
    from trnfrontier.sweep.trial import TrialFailed, run_one_trial

    script = tmp_path / "train.py"
    script.write_text("")
    spec = SweepSpec.model_validate({"name": "k", "train_py": str(script), "concurrency": 2, "space": {"--lr": {"grid": [1, 2]}}})
    job = Job("sweep-1", str(tmp_path / "sw"), spec, str(tmp_path))
    run_dir = job.run_dir("t0")
    run_dir.mkdir(parents=True)
    ignored = {"status": "completed", "out_dir_ignored": True, "final_checkpoint": str(tmp_path / "final.pt")}
    (run_dir / "summary.json").write_text(json.dumps(ignored))
    sent: list[dict] = []
    with pytest.raises(TrialFailed, match="train.py ignores NEURON_COMPETITION_R1_OUT_DIR"):
        run_one_trial(job, "t0", {"--lr": 1}, sent.append)  # completed: reported again, not trained
    assert sent == []
    line = _error_of(SimpleNamespace(trial_id="t0"), job)
    assert line.startswith("train.py ignores NEURON_COMPETITION_R1_OUT_DIR") and line.endswith("concurrency: 1")
    # `trnf sweep status` of a failed trial whose error sweep.json lost reads the same line.
    sweep = st.SweepState(folder=Path(job.sweep_dir), sweep_id="sweep-1", name="k", spec={}, created=0.0,
                          trials={"t0": {"status": st.FAILED, "run_dir": run_dir.name, "params": {"--lr": 1}}})  # fmt: skip
    assert rows(sweep, spec)[0]["error"] == line
    # Without the trial's line, the run directory is read, and a summary that exists is never called missing.
    job.log("t0").with_suffix(".error").unlink()
    fallback = _error_of(SimpleNamespace(trial_id="t0"), job)
    assert "no summary.json" not in fallback and fallback.startswith(f"{run_dir / 'summary.json'} says completed and names no error")

    recipe_spec = SweepSpec.model_validate({"name": "r", "recipe": "cpu_smoke", "seeds": [1, 2]})
    recipe_job = Job("sweep-2", str(tmp_path / "sw2"), recipe_spec, str(tmp_path))
    recipe_run = recipe_job.run_dir("t1")
    recipe_run.mkdir(parents=True)
    (recipe_run / "summary.json").write_text(json.dumps({"status": "completed", "val_bpb": None}))
    with pytest.raises(TrialFailed, match="the run completed without a val_bpb"):
        run_one_trial(recipe_job, "t1", {"runtime.seed": 1}, sent.append)
    assert _error_of(SimpleNamespace(trial_id="t1"), recipe_job).startswith("the run completed without a val_bpb (see ")


def test_nproc_is_the_recipe_trials_runtime_nproc(tmp_path: Path) -> None:
    """nproc applies to recipe trials as `trnf train --nproc` does (runtime.nproc), is
    checked against the recipe before anything starts, and is given once."""
    base = {"space": {"optim.matrix_lr": {"grid": [0.01, 0.02]}}}
    spec = read_spec(_spec(tmp_path, {**base, "nproc": 2}))
    words = train_words(spec, {"optim.matrix_lr": 0.02}, "runs/x/t0")
    assert words == ["cpu_smoke", "runtime.nproc=2", "optim.matrix_lr=0.02", "--out", "runs/x/t0"]
    # Not given: the recipe's own runtime.nproc, untouched (nor written into the kept spec).
    plain = read_spec(_spec(tmp_path, base))
    assert plain.nproc is None and train_words(plain, {"optim.matrix_lr": 0.02}, "o")[1:2] == ["optim.matrix_lr=0.02"]
    assert "nproc" not in plain.model_dump(exclude_none=True)
    with pytest.raises(TrnfError, match=r"s\.yaml: nproc: 1000: cpu_smoke: invalid recipe: runtime\.nproc"):
        read_spec(_spec(tmp_path, {**base, "nproc": 1000}))  # out of the recipe's bounds: said now, named
    for extra, where in (({"overrides": ["runtime.nproc=4"]}, "overrides"), ({"space": {"runtime.nproc": {"grid": [1, 2]}}}, "space.runtime.nproc")):
        with pytest.raises(TrnfError, match=f"nproc: {where} sets runtime.nproc too; give the process count once"):
            read_spec(_spec(tmp_path, {**base, **extra, "nproc": 2}))


def test_a_cluster_trial_gets_the_drivers_trnf_neuron_and_kit_variables() -> None:
    from trnfrontier.contract.kit import OUT_DIR_ENV
    from trnfrontier.sweep.engine import forwarded_env

    environ = {OUT_DIR_ENV: "/o", "TRNF_LEDGER": "/l", "TRNF_SUPERVISOR": "1", "NEURON_CC_FLAGS": "-O1", "HOME": "/h"}
    assert forwarded_env(environ) == {OUT_DIR_ENV: "/o", "TRNF_LEDGER": "/l", "NEURON_CC_FLAGS": "-O1"}
