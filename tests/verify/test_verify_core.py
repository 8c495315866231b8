"""`trnf verify ARCHIVE --core`: CORE of the archive's model, served from the sandbox, scored
in verify's process; the same verdicts as the same model scored directly."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from verify_kit import TRAIN_PY, build_archive, pins_file

from trnfrontier.evaluate.core.job import prepare_core
from trnfrontier.evaluate.core.run import CoreOptions, evaluate_core
from trnfrontier.verify import Options, verify_archive


@pytest.mark.slow
def test_core_of_an_archive_matches_the_model_scored_directly(sample_home: Path, prepare_module, tmp_path: Path) -> None:
    archive = build_archive(tmp_path)
    setup = prepare_core("sample", None, 4)
    report = verify_archive(archive, Options(pins_file=pins_file(tmp_path), core=setup))
    check = report.get("core")
    assert check is not None and check.verdict == "pass", check
    assert "NOT the full metric" in check.reason and "crop 32" in check.reason
    assert report.to_json()["core"] == report.core
    module = types.ModuleType("tiny_train")
    exec(compile(TRAIN_PY, "train.py", "exec"), module.__dict__)
    model = module.load_for_eval(str(tmp_path / "submission.tar.src" / "checkpoint" / "final.pt"), "cpu")
    direct = evaluate_core(setup.resolved, model, prepare_module.ensure_tokenizer(), torch.device("cpu"),
                           CoreOptions(max_per_task=4, crop=32, crop_source="test"))
    assert {k: t["accuracy"] for k, t in report.core["tasks"].items()} == {k: t["accuracy"] for k, t in direct["tasks"].items()}
