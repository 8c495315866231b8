"""Reading a bundle folder: the sample reads; every bad bundle is one clear line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from core_helpers import write_bundle

from trnfrontier.evaluate.core.bundle import BundleError, read_bundle

MC_LINE = json.dumps({"query": "Q", "choices": ["a", "b"], "gold": 1}) + "\n"
LM_LINE = json.dumps({"context": "c", "continuation": "d"}) + "\n"
TASKS = [
    {"label": "mc", "icl_task_type": "multiple_choice", "dataset_uri": "k/mc.jsonl", "num_fewshot": [0]},
    {"label": "lm", "icl_task_type": "language_modeling", "dataset_uri": "lm.jsonl", "num_fewshot": [2, 5], "continuation_delimiter": "\n"},
]


def good(tmp_path: Path) -> Path:
    return write_bundle(tmp_path / "eval_bundle", [dict(t) for t in TASKS], {"mc": 50, "lm": 0, "other": 25.5},
                        {"k/mc.jsonl": MC_LINE * 3, "lm.jsonl": LM_LINE * 3})


def test_a_good_bundle_reads_with_defaults_and_first_fewshot_entry(tmp_path: Path) -> None:
    bundle = read_bundle(good(tmp_path))
    mc, lm = bundle.tasks
    assert (mc.label, mc.kind, mc.num_fewshot, mc.delimiter, mc.baseline) == ("mc", "multiple_choice", 0, " ", 50.0)
    assert (lm.num_fewshot, lm.delimiter) == (2, "\n")
    assert bundle.items(mc) == [json.loads(MC_LINE)] * 3


def test_the_format_sample_reads(sample_bundle) -> None:
    bundle = sample_bundle.bundle
    assert {t.kind for t in bundle.tasks} == {"multiple_choice", "schema", "language_modeling"}
    assert all(t.label.startswith("sample_") for t in bundle.tasks)
    assert sum(len(bundle.items(t)) for t in bundle.tasks) > 100


def rewrite(root: Path, name: str, text: str) -> None:
    (root / name).write_text(text, encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("core.yaml", "icl_tasks: [\n  - label: x\n", r"core.yaml:\d+: not valid YAML"),
        ("core.yaml", "tasks: []\n", "expected a mapping with an icl_tasks list"),
        ("core.yaml", "icl_tasks: []\n", "icl_tasks is empty"),
        ("eval_meta_data.csv", "Task,Random baseline\nmc,50\n", "no 'Eval Task' column"),
        ("eval_meta_data.csv", "Eval Task,Random baseline\nmc,fifty\nlm,0\n", r"eval_meta_data.csv:2: Random baseline 'fifty'"),
        ("eval_meta_data.csv", "Eval Task,Random baseline\nmc,50\n", "no 'Eval Task' row for 'lm'"),
    ],
)
def test_bad_config_or_metadata_is_one_line_naming_the_file(tmp_path: Path, name: str, text: str, message: str) -> None:
    root = good(tmp_path)
    rewrite(root, name, text)
    with pytest.raises(BundleError, match=message):
        read_bundle(root)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"icl_task_type": "generation_task_with_answers"}, "unknown icl_task_type 'generation_task_with_answers'"),
        ({"num_fewshot": 3}, "num_fewshot must be a list"),
        ({"dataset_uri": "../../etc/passwd"}, "must be a relative path inside eval_data"),
        ({"dataset_uri": "/etc/passwd"}, "must be a relative path inside eval_data"),
        ({"dataset_uri": "k/missing.jsonl"}, r"eval_data/k/missing.jsonl: missing"),
        ({"continuation_delimiter": None}, "continuation_delimiter must be a string"),
        ({"label": "lm"}, "label 'lm' appears twice"),
    ],
)
def test_bad_task_entries_are_refused_by_name(tmp_path: Path, change: dict, message: str) -> None:
    root = good(tmp_path)
    import yaml

    tasks = [dict(TASKS[0], **change), dict(TASKS[1])]
    rewrite(root, "core.yaml", yaml.safe_dump({"icl_tasks": tasks}))
    with pytest.raises(BundleError, match=message):
        read_bundle(root)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (MC_LINE + "{not json\n", r"eval_data/k/mc.jsonl:2: not valid JSON"),
        (MC_LINE + "\n" + MC_LINE, r"mc.jsonl:2: empty line"),
        (MC_LINE + "[1, 2]\n", r"mc.jsonl:2: expected a JSON object, got list"),
        (MC_LINE * 2 + json.dumps({"query": "Q", "gold": 0}) + "\n", r"mc.jsonl:3: .*choices missing"),
        (json.dumps({"query": "Q", "choices": ["a"], "gold": 1}) + "\n", r"mc.jsonl:1: gold 1 is not an index of its 1 choices"),
        (json.dumps({"query": "Q", "choices": [], "gold": 0}) + "\n", r"mc.jsonl:1: choices must be a non-empty list"),
        (json.dumps({"query": "Q", "choices": ["a"], "gold": "0"}) + "\n", r"mc.jsonl:1: gold '0'"),
        ("", r"mc.jsonl: no items"),
    ],
)
def test_a_bad_item_is_refused_as_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    root = good(tmp_path)
    (root / "eval_data" / "k" / "mc.jsonl").write_text(text, encoding="utf-8")
    bundle = read_bundle(root)
    with pytest.raises(BundleError, match=message):
        bundle.items(bundle.tasks[0])


def test_a_folder_without_core_yaml_says_what_a_bundle_holds(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no core.yaml; a CORE bundle folder holds"):
        read_bundle(tmp_path)
