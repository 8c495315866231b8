"""The CORE report: accuracies, centered scores, the metric, the projection; two gloo ranks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from core_helpers import elementwise_model, rank_worker, write_bundle

from trnfrontier.errors import TrnfError
from trnfrontier.evaluate.core import fetch
from trnfrontier.evaluate.core.run import (
    CoreOptions,
    crop_length,
    evaluate_core,
)

TASK_KEYS = {"accuracy", "centered", "items", "type", "num_fewshot"}


@pytest.fixture(scope="module")
def report(sample_bundle, tokenizer) -> dict:
    return evaluate_core(sample_bundle, elementwise_model(), tokenizer, torch.device("cpu"), CoreOptions(crop=64, crop_source="--seq-len"))


def test_the_report_has_the_documented_shape(report, sample_bundle) -> None:
    assert set(report["tasks"]) == {t.label for t in sample_bundle.bundle.tasks}
    assert all(TASK_KEYS <= set(task) for task in report["tasks"].values())
    assert report["bundle_sha256"] == fetch.SAMPLE_BUNDLE_SHA256 and report["format_sample"]
    assert report["full_metric"] and report["max_per_task"] is None
    assert (report["crop"], report["crop_source"], report["world_size"]) == (64, "--seq-len", 1)
    assert report["seconds"] > 0
    json.dumps(report)  # what --json prints


def test_accuracy_is_a_float32_mean_and_core_the_mean_of_centered_scores(report, sample_bundle) -> None:
    for task in sample_bundle.bundle.tasks:
        row = report["tasks"][task.label]
        assert row["items"] == len(sample_bundle.bundle.items(task))
        # nanochat: a float32 tensor of 0/1 verdicts, .mean().item()
        correct = round(row["accuracy"] * row["items"])
        assert row["accuracy"] == torch.tensor([1.0] * correct + [0.0] * (row["items"] - correct)).mean().item()
        b = task.baseline
        assert row["centered"] == (row["accuracy"] - 0.01 * b) / (1.0 - 0.01 * b)
    centered = [t["centered"] for t in report["tasks"].values()]
    assert report["core_metric"] == sum(centered) / len(centered)


def test_the_projection_scales_the_measured_cost_to_the_whole_bundle(report) -> None:
    projection = report["projection"]
    assert projection["limit_seconds"] == 3600
    assert projection["items_in_bundle"] == sum(t["items"] for t in report["tasks"].values())
    assert math.isclose(projection["rank_seconds"], sum(t["rank_seconds"] for t in report["tasks"].values()))
    assert projection["seconds_at_ranks"]["1"] == projection["rank_seconds"]
    assert projection["seconds_at_ranks"]["64"] == projection["rank_seconds"] / 64  # Phase 2 at LNC 2


def test_max_per_task_is_marked_as_not_the_full_metric(sample_bundle, tokenizer) -> None:
    options = CoreOptions(max_per_task=5, project_ranks=(16,))
    report = evaluate_core(sample_bundle, elementwise_model(), tokenizer, torch.device("cpu"), options)
    assert not report["full_metric"] and report["max_per_task"] == 5
    assert {t["items"] for t in report["tasks"].values()} == {5}
    assert report["projection"]["items_in_bundle"] == sum(len(sample_bundle.bundle.items(t)) for t in sample_bundle.bundle.tasks)
    assert set(report["projection"]["seconds_at_ranks"]) == {"1", "16"}


def test_a_model_that_declares_max_seq_len_sets_the_crop() -> None:
    model = torch.nn.Linear(1, 1)
    assert crop_length(model, 512, "--seq-len") == (512, "--seq-len")
    model.max_seq_len = 128
    assert crop_length(model, 512, "--seq-len") == (128, "model.max_seq_len")


def test_two_gloo_ranks_share_the_items_and_agree_with_one(tmp_path: Path, sample_bundle, tokenizer) -> None:
    import torch.multiprocessing as mp

    # "th" + "e" is one token, "the": the prompt without is no token prefix of the prompt with.
    bad_items = '{"context": "fine", "continuation": " yes"}\n{"context": "th", "continuation": "e"}\n'
    bad = write_bundle(tmp_path / "bad", [{"label": "lm", "icl_task_type": "language_modeling", "dataset_uri": "lm.jsonl",
                                           "num_fewshot": [0], "continuation_delimiter": ""}], {"lm": 0}, {"lm.jsonl": bad_items})
    jobs = [(str(sample_bundle.bundle.root), "sample"), (str(bad), "bad")]
    mp.spawn(rank_worker, args=(2, str(tmp_path / "store"), jobs, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"sample-{r}.json").read_text()) for r in (0, 1)]
    single = evaluate_core(fetch.resolve(str(sample_bundle.bundle.root)), elementwise_model(), tokenizer, torch.device("cpu"), CoreOptions())
    for report in ranks:
        assert report["world_size"] == 2
        assert report["core_metric"] == single["core_metric"]
        assert {k: (t["accuracy"], t["items"]) for k, t in report["tasks"].items()} == {k: (t["accuracy"], t["items"]) for k, t in single["tasks"].items()}
    # The broken item fails on one rank; both ranks report it instead of one waiting forever.
    errors = [json.loads((tmp_path / f"bad-{r}.json").read_text())["error"] for r in (0, 1)]
    assert errors[0] == errors[1] and "does not tokenize to a prefix" in errors[0] and errors[0].startswith("rank ")
    with pytest.raises(TrnfError, match="does not tokenize to a prefix"):
        evaluate_core(fetch.resolve(str(bad)), elementwise_model(), tokenizer, torch.device("cpu"), CoreOptions())


def _lm_bundle(root: Path, bad_line: int, lines: int = 8) -> Path:
    """A language-modeling task whose item on ``bad_line`` cannot be scored ("th" + "e"
    tokenizes as "the": the prompt without its continuation is no token prefix)."""
    items = [
        '{"context": "th", "continuation": "e"}' if number == bad_line else f'{{"context": "item {number}", "continuation": " yes"}}'
        for number in range(1, lines + 1)
    ]
    task = {"label": "lm", "icl_task_type": "language_modeling", "dataset_uri": "lm.jsonl", "num_fewshot": [0], "continuation_delimiter": ""}
    return write_bundle(root, [task], {"lm": 0}, {"lm.jsonl": "\n".join(items) + "\n"})


@pytest.mark.parametrize("bad_line", [2, 8])
def test_an_unscorable_item_is_named_by_file_and_line_through_the_shuffle(tmp_path: Path, tokenizer, bad_line: int) -> None:
    from trnfrontier.evaluate.core import render
    from trnfrontier.evaluate.core.run import check_continuations

    assert render.shuffled_order(8, None).index(bad_line - 1) != bad_line - 1  # the shuffle moves it
    resolved = fetch.resolve(str(_lm_bundle(tmp_path / "bad", bad_line)))
    where = f"bad/eval_data/lm.jsonl:{bad_line} (task 'lm'): the prompt without its continuation does not tokenize to a prefix"
    with pytest.raises(TrnfError) as before_any_model:
        check_continuations(resolved.bundle, tokenizer, None)
    assert str(before_any_model.value).startswith(where)
    with pytest.raises(TrnfError) as while_scoring:
        evaluate_core(resolved, elementwise_model(), tokenizer, torch.device("cpu"), CoreOptions())
    assert str(while_scoring.value).startswith(where)


def test_a_crop_failure_is_named_by_file_and_line(tmp_path: Path, tokenizer) -> None:
    long_choice = " ".join(["word"] * 40)
    items = ['{"query": "q1", "choices": [" a", " b"], "gold": 0}', f'{{"query": "q2", "choices": [" a", "{long_choice}"], "gold": 0}}']
    task = {"label": "mc", "icl_task_type": "multiple_choice", "dataset_uri": "mc.jsonl", "num_fewshot": [0]}
    resolved = fetch.resolve(str(write_bundle(tmp_path / "long", [task], {"mc": 50}, {"mc.jsonl": "\n".join(items) + "\n"})))
    with pytest.raises(TrnfError, match=r"^long/eval_data/mc\.jsonl:2 \(task 'mc'\): its scored tokens start"):
        evaluate_core(resolved, elementwise_model(), tokenizer, torch.device("cpu"), CoreOptions(crop=16))
