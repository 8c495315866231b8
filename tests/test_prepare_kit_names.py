"""The kit names of the project's prepare.py: the step log and data-root variables,
_row_groups_for_split and _document_batches."""

from __future__ import annotations

import json

import pyarrow.parquet as pq


def test_record_step_boundary_writes_the_official_runners_log(prepare_module, tmp_path, monkeypatch) -> None:
    official, ours = tmp_path / "official.jsonl", tmp_path / "trnf.jsonl"
    monkeypatch.setenv("NEURON_COMPETITION_R1_STEP_LOG", str(official))
    monkeypatch.setenv("TRNF_STEP_LOG", str(ours))
    monkeypatch.setattr(prepare_module, "_step_log_started", set())
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    for index in range(6):  # the kit's 0-based indexes
        prepare_module.record_step_boundary(index)
    assert not ours.exists()
    steps = [json.loads(line).get("step") for line in official.read_text().splitlines()]
    assert steps == [None, 0, 1, 2, 3, 4, 5]
    accounting = prepare_module.budget_accounting(official)
    assert accounting["steps"] == 6
    boundary_4 = json.loads(official.read_text().splitlines()[5])["time"]  # index 4 ends startup
    assert accounting["startup_seconds"] == boundary_4 - accounting["start_time"]


def test_the_kit_cache_dir_is_the_data_root(prepare_module, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NEURON_COMPETITION_R1_CACHE_DIR", str(tmp_path / "kit"))
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "trnf"))
    assert prepare_module.trnf_home() == (tmp_path / "kit").resolve()


def test_row_groups_are_dealt_to_ranks(prepare_module, sample_home) -> None:
    every = prepare_module._row_groups_for_split("train", 0, 1)
    assert every and all(pq.ParquetFile(path).num_row_groups > group for path, group in every)
    ranks = [prepare_module._row_groups_for_split("train", rank, 3) for rank in range(3)]
    assert sorted(pair for share in ranks for pair in share) == sorted(every)
    assert ranks[1] == every[1::3]
    val = prepare_module._row_groups_for_split("public_val", 0, 1)
    assert val and not set(val) & set(every)


def test_document_batches_yield_text_and_epoch_forever(prepare_module, sample_home) -> None:
    groups = prepare_module._row_groups_for_split("public_val", 0, 1)
    documents = sum(pq.ParquetFile(path).metadata.row_group(group).num_rows for path, group in groups)
    batches = prepare_module._document_batches("public_val", 0, 1, tokenizer_batch_size=64)
    seen, epochs = 0, set()
    while seen < documents + 1:
        docs, epoch = next(batches)
        assert docs and all(isinstance(d, str) for d in docs) and len(docs) <= 64
        seen += len(docs)
        epochs.add(epoch)
    assert epochs == {1, 2}  # past the end of the split it starts over as epoch 2
