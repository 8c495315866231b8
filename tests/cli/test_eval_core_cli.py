"""`trnf eval --core`: CORE beside val_bpb, for trnf runs and kit train.py files; bad bundles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.cli.test_eval_cli import FAST, _kit_train_py, _save_run
from tests.cli_run import run_cli

torch.set_num_threads(1)

CORE = ["--core", "--bundle", "sample", "--max-per-task", "4"]
TASK_KEYS = {"accuracy", "centered", "items", "type", "num_fewshot"}


def test_core_of_a_run_is_reported_beside_val_bpb(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _save_run(tmp_path / "run", head_std=0.5)
    code, out, err = run_cli(["eval", str(run), "--json", *FAST, *CORE, "--core-batch-tokens", "300"], capsys)
    assert code == 0, err
    result = json.loads(out)["results"][0]
    assert result["core"]["batch_tokens"] == 300  # the flag reaches the worker's batches
    assert result["status"] == "ok" and result["val_bpb"] > 0
    core = result["core"]
    assert {"core_metric", "tasks", "bundle_sha256", "seconds"} <= set(core)
    assert all(TASK_KEYS <= set(task) and task["items"] == 4 for task in core["tasks"].values())
    assert not core["full_metric"] and core["max_per_task"] == 4 and core["format_sample"]
    assert (core["crop"], core["crop_source"]) == (64, "--seq-len")
    assert core["core_metric"] == sum(t["centered"] for t in core["tasks"].values()) / len(core["tasks"])


@pytest.mark.slow
def test_core_of_a_kit_train_py_and_the_table(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = _kit_train_py(tmp_path / "kit")
    code, out, err = run_cli(["eval", "--train-py", str(train_py), "--checkpoint", str(train_py.parent / "final.pt"), *FAST, *CORE], capsys)
    assert code == 0, err
    assert "CORE of" in out and "NOT the full metric" in out and "format sample: a score on it means nothing" in out
    assert "Phase 2 limit is 3,600 s" in out


@pytest.mark.slow
def test_core_under_two_ranks_matches_one(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _save_run(tmp_path / "run", head_std=0.5)
    reports = []
    for nproc in ("1", "2"):
        code, out, err = run_cli(["eval", str(run), "--json", *FAST, *CORE, "--nproc", nproc], capsys)
        assert code == 0, err
        reports.append(json.loads(out)["results"][0])
    one, two = (r["core"] for r in reports)
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert {k: t["accuracy"] for k, t in two["tasks"].items()} == {k: t["accuracy"] for k, t in one["tasks"].items()}
    assert abs(reports[0]["val_bpb"] - reports[1]["val_bpb"]) < 1e-5


def test_bad_bundles_and_options_are_one_line_before_any_model_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "no-such-run"  # never loaded: every case fails first
    broken = tmp_path / "bundle"
    broken.mkdir()
    (broken / "core.yaml").write_text("icl_tasks: [\n", encoding="utf-8")
    (broken / "eval_meta_data.csv").write_text("Eval Task,Random baseline\n", encoding="utf-8")
    cases = [
        (["--bundle", "sample"], "--bundle go(es) with --core", 2),
        (["--core", "--bundle", str(broken)], "core.yaml:2: not valid YAML", 1),
        (["--core", "--bundle", "sample", "--max-per-task", "2"], "is 3-shot but would score 2 item(s)", 1),
        (["--core", "--bundle", "sample", "--bundle-sha256", "0" * 64], "but the pin is 0000", 1),
        (["--core"], "--core needs a bundle", 2),
        (["--core-batch-tokens", "64"], "--core-batch-tokens go(es) with --core", 2),
    ]
    for args, message, exit_code in cases:
        code, out, err = run_cli(["eval", str(run), *args], capsys)
        assert code == exit_code and message in err and "Traceback" not in err, (args, err)


def test_out_of_memory_under_core_names_a_flag_trnf_eval_takes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from trnfrontier.evaluate import worker
    from trnfrontier.evaluate.core import run as core_run

    def out_of_memory(*_args: object, **_kwargs: object) -> None:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(core_run, "run_job", out_of_memory)
    spec = SimpleNamespace(progress_file=None, core={"batch_tokens": 2048})
    with pytest.raises(worker.WorkerError) as raised:
        worker._core(spec, None, None, torch.device("cpu"))  # type: ignore[arg-type]
    message = str(raised.value)
    assert raised.value.kind == "memory" and "2,048 padded tokens" in message
    flag, value = message.split("--core ", 1)[1].split("`")[0].split()
    assert (flag, value) == ("--core-batch-tokens", "512")
    # The flag the hint names is one `trnf eval` parses (here refused only for lacking --core).
    code, _out, err = run_cli(["eval", str(tmp_path / "no-such-run"), flag, value], capsys)
    assert code == 2 and f"{flag} go(es) with --core" in err


def test_an_unscorable_bundle_item_is_one_line_naming_its_file_and_line(sample_home: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from tests.evaluate.core.core_helpers import write_bundle

    items = "".join(f'{{"context": "item {n}", "continuation": " yes"}}\n' for n in range(1, 6)) + '{"context": "th", "continuation": "e"}\n'
    task = {"label": "lm", "icl_task_type": "language_modeling", "dataset_uri": "lm.jsonl", "num_fewshot": [0], "continuation_delimiter": ""}
    bundle = write_bundle(tmp_path / "bundle", [task], {"lm": 0}, {"lm.jsonl": items})
    run = _save_run(tmp_path / "run", head_std=0.5)
    code, _out, err = run_cli(["eval", str(run), *FAST, "--core", "--bundle", str(bundle)], capsys)
    assert code == 1 and "Traceback" not in err
    assert "bundle/eval_data/lm.jsonl:6 (task 'lm'): the prompt without its continuation does not tokenize" in err
