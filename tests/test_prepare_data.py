"""prepare.py setup: the sample and local sources, the manifest, reuse, bad input; the data loader."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sample_texts(sample_home: Path) -> dict[str, list[str]]:
    shards = sample_home / "datasets" / "sample" / "shards"
    return {role: pq.read_table(shards / f"{role}_00000.parquet").column("text").to_pylist() for role in ("train", "public_val")}


# ---------------------------------------------------------------------------- setup / manifest


def test_sample_dataset_is_complete_and_fingerprinted(sample_home: Path, prepare_module) -> None:
    directory = sample_home / "datasets" / "sample"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert (sample_home / "active").read_text().strip() == "sample"
    assert manifest["source"] == "sample" and manifest["bytes"] >= prepare_module.SAMPLE_MIN_BYTES
    for entry in [manifest["tokenizer"], *manifest["shards"], *manifest["token_files"]]:
        assert sha256(directory / entry["path"]) == entry["sha256"], entry["path"]
    assert manifest["tokenizer"]["vocab_size"] == prepare_module.TOKENIZER_VOCAB_SIZE
    tokenizer = prepare_module.ensure_tokenizer()
    bos = tokenizer.get_bos_token_id()
    for entry in manifest["token_files"]:
        tokens = np.fromfile(directory / entry["path"], dtype=np.uint16)
        assert len(tokens) == entry["tokens"] and tokens[0] == bos
        assert int((tokens == bos).sum()) == entry["documents"]
        assert tokens.max() < tokenizer.get_vocab_size()
    texts = sample_texts(sample_home)
    assert sum(len(t) for t in texts.values()) == manifest["documents"]
    assert not set(texts["train"]) & set(texts["public_val"])


def test_tokens_decode_back_to_the_documents(sample_home: Path, prepare_module) -> None:
    tokenizer = prepare_module.ensure_tokenizer()
    directory = sample_home / "datasets" / "sample"
    tokens = np.fromfile(directory / "tokens" / "public_val_00000.bin", dtype=np.uint16)
    starts = np.flatnonzero(tokens == tokenizer.get_bos_token_id())
    first = tokenizer.decode(tokens[starts[0] + 1:starts[1]].tolist())
    assert first == sample_texts(sample_home)["public_val"][0]


def test_second_setup_reuses_everything(sample_home: Path, prepare_module) -> None:
    before = {p: p.stat().st_mtime_ns for p in sample_home.rglob("*") if p.is_file()}
    result = prepare_module.setup("sample", home=sample_home)
    assert result["reused"] is True
    assert {p: p.stat().st_mtime_ns for p in sample_home.rglob("*") if p.is_file()} == before


def test_damaged_file_is_rebuilt_with_the_same_tokenizer(sample_home: Path, prepare_module, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(sample_home, home)
    original = json.loads((sample_home / "datasets" / "sample" / "manifest.json").read_text())
    damaged = home / "datasets" / "sample" / "tokens" / "train_00000.bin"
    data = bytearray(damaged.read_bytes())
    data[100] ^= 0xFF
    damaged.write_bytes(bytes(data))
    result = prepare_module.setup("sample", home=home)
    assert result["reused"] is False
    # Deterministic: a fresh build gives the same tokenizer and the same token files.
    assert result["tokenizer_sha256"] == prepare_module.tokenizer_pin(original)
    rebuilt = json.loads((home / "datasets" / "sample" / "manifest.json").read_text())
    assert rebuilt["tokenizer"]["sha256"] == original["tokenizer"]["sha256"]
    assert [e["sha256"] for e in rebuilt["token_files"]] == [e["sha256"] for e in original["token_files"]]


def test_tampered_tokenizer_is_refused(sample_home: Path, prepare_module, tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    shutil.copytree(sample_home, home)
    with open(home / "tokenizer" / "tokenizer.pkl", "ab") as handle:  # where the shipped one is unpacked
        handle.write(b"\0")
    monkeypatch.setenv("TRNF_HOME", str(home))
    with pytest.raises(prepare_module.PrepareError, match="SHA256"):
        prepare_module.ensure_tokenizer()


def test_local_source_reads_parquet_jsonl_and_txt(sample_home: Path, prepare_module, tmp_path: Path) -> None:
    texts = sample_texts(sample_home)["train"] + sample_texts(sample_home)["public_val"]
    source = tmp_path / "corpus"
    source.mkdir()
    third = len(texts) // 3
    pq.write_table(pa.table({"text": texts[:third], "id": list(range(third))}), source / "a.parquet")
    (source / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[third:2 * third]))
    (source / "c.txt").write_text("\n\n".join(t.replace("\n\n", "\n") for t in texts[2 * third:]))
    home = tmp_path / "home"
    result = prepare_module.setup("local", path=source, home=home)
    assert result["dataset"] == "local-corpus" and result["source"] == "local"
    assert (home / "active").read_text().strip() == "local-corpus"
    assert result["bytes"] >= sum(len(t.encode()) for t in texts[:2 * third])
    assert result["documents"] >= 2 * third

    # Something bad appears in the folder: the rebuild fails and leaves nothing trusted.
    (source / "d.txt").write_bytes(b"caf\xe9 latin-1\n")
    with pytest.raises(prepare_module.PrepareError, match="d.txt: not UTF-8"):
        prepare_module.setup("local", path=source, home=home)
    assert not (home / "datasets" / "local-corpus" / "manifest.json").exists()
    with pytest.raises(prepare_module.PrepareError, match="not prepared"):
        prepare_module.dataset_dir("local-corpus", home=home)


@pytest.mark.parametrize(
    "files, message",
    [
        (None, "no such file or directory"),
        ({}, "no .parquet, .jsonl or .txt files"),
        ({"x.jsonl": b'{"body": "hello"}\n'}, r"x.jsonl:1: no \"text\" string"),
        ({"x.jsonl": b"not json\n"}, "x.jsonl:1: not valid JSON"),
        ({"x.txt": b"\xff\xfe bad bytes"}, "x.txt: not UTF-8"),
        ({"x.parquet": b"PAR1 not really PAR1"}, "x.parquet: not a readable parquet file"),
        ({"small.jsonl": "".join(json.dumps({"text": f"Small document number {i}."}) + "\n" for i in range(300))},
         "too small for a vocabulary of 8192"),
    ],
)
def test_local_bad_input_is_one_clear_error(files, message, prepare_module, tmp_path: Path) -> None:
    source = tmp_path / "corpus"
    if files is not None:
        source.mkdir()
        for name, content in files.items():
            (source / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(prepare_module.PrepareError, match=message):
        prepare_module.setup("local", path=source, home=tmp_path / "home")
    assert not list((tmp_path / "home").rglob("manifest.json"))


def test_parquet_without_text_column_names_the_file(prepare_module, tmp_path: Path) -> None:
    source = tmp_path / "corpus"
    source.mkdir()
    pq.write_table(pa.table({"body": ["hello there"] * 10}), source / "nocol.parquet")
    with pytest.raises(prepare_module.PrepareError, match=r"nocol.parquet: no `text` column \(columns: body\)"):
        prepare_module.setup("local", path=source, home=tmp_path / "home")


def test_unknown_source_and_missing_path_are_refused(prepare_module, tmp_path: Path) -> None:
    with pytest.raises(prepare_module.PrepareError, match="unknown source"):
        prepare_module.setup("webcrawl", home=tmp_path)
    with pytest.raises(prepare_module.PrepareError, match="needs --path"):
        prepare_module.setup("local", home=tmp_path)


def test_no_dataset_is_a_clear_error(prepare_module, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path))
    monkeypatch.delenv("TRNF_DATASET", raising=False)
    with pytest.raises(prepare_module.PrepareError, match="no prepared dataset"):
        prepare_module.ensure_tokenizer()


def test_tinyshakespeare_prepares_as_a_local_txt_source(tinyshakespeare: Path, prepare_module, tmp_path: Path) -> None:
    source = tmp_path / "shakespeare"
    source.mkdir()
    shutil.copy(tinyshakespeare, source / "input.txt")
    result = prepare_module.setup("local", path=source, home=tmp_path / "home")
    assert result["dataset"] == "local-shakespeare" and result["documents"] > 0
    assert result["train_tokens"] > result["public_val_tokens"] > 0
    # Paragraph splitting only drops the blank lines between documents.
    assert 0 < tinyshakespeare.stat().st_size - result["bytes"] < tinyshakespeare.stat().st_size // 100


# ---------------------------------------------------------------------------- data loader


@pytest.fixture(scope="module")
def tokenizer(sample_home, prepare_module):
    torch.set_num_threads(1)
    return prepare_module.ensure_tokenizer()


def test_batches_are_shifted_bos_aligned_rows(tokenizer, prepare_module) -> None:
    loader = prepare_module.make_dataloader(tokenizer, 4, 128, "train")
    inputs, targets, state = next(loader)
    assert inputs.shape == targets.shape == (4, 128)
    assert (inputs.dtype, targets.dtype) == (torch.int32, torch.int64)  # as the organisers' loader
    assert torch.equal(inputs[:, 1:].long(), targets[:, :-1])
    assert (inputs[:, 0] == tokenizer.get_bos_token_id()).all()
    assert json.loads(json.dumps(state)) == state


def test_resume_state_continues_with_the_same_batches(tokenizer, prepare_module) -> None:
    loader = prepare_module.make_dataloader(tokenizer, 4, 256, "train", buffer_size=64)
    for _ in range(3):
        _, _, state = next(loader)
    expected = [next(loader)[:2] for _ in range(4)]
    resumed = prepare_module.make_dataloader(tokenizer, 4, 256, "train", buffer_size=64,
                                             resume_state=json.loads(json.dumps(state)))
    for (x, y), (rx, ry, _) in zip(expected, resumed, strict=False):  # resumed never ends
        assert torch.equal(x, rx) and torch.equal(y, ry)


def test_train_split_loops_over_epochs_and_resumes_across_them(tokenizer, prepare_module, sample_home: Path) -> None:
    manifest = json.loads((sample_home / "datasets" / "sample" / "manifest.json").read_text())
    train_tokens = sum(e["tokens"] for e in manifest["token_files"] if e["role"] == "train")
    batch, seq = 8, 1024
    loader = prepare_module.make_dataloader(tokenizer, batch, seq, "train", buffer_size=32)
    states = [next(loader)[2] for _ in range(train_tokens // (batch * (seq + 1)) + 2)]
    assert states[-1]["epoch"] >= 1
    wrap = next(i for i, s in enumerate(states) if s["epoch"] >= 1)
    resumed = prepare_module.make_dataloader(tokenizer, batch, seq, "train", buffer_size=32, resume_state=states[wrap - 1])
    assert next(resumed)[2] == states[wrap]


def test_validation_split_ends_after_one_pass(tokenizer, prepare_module, sample_home: Path) -> None:
    manifest = json.loads((sample_home / "datasets" / "sample" / "manifest.json").read_text())
    val_tokens = sum(e["tokens"] for e in manifest["token_files"] if e["role"] == "public_val")
    served = sum(x.numel() + x.shape[0] for x, _, _ in prepare_module.make_dataloader(tokenizer, 4, 512, "val"))
    assert 0 < served <= val_tokens


def test_ranks_read_disjoint_documents(tokenizer, prepare_module) -> None:
    buffers = []
    for rank in (0, 1):
        loader = prepare_module.make_dataloader(tokenizer, 2, 64, "public_val", rank=rank, world_size=2, buffer_size=50)
        first = next(loader)[0]
        buffers.append((first, {tuple(item) for item in next(loader)[2]["buffer"]}))
    (first0, docs0), (first1, docs1) = buffers
    assert docs0 and docs1 and not docs0 & docs1
    assert all(doc % 2 == 0 for _, doc in docs0) and all(doc % 2 == 1 for _, doc in docs1)
    assert not torch.equal(first0, first1)


def test_dataloader_rank_comes_from_torchrun_env(tokenizer, prepare_module, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert prepare_module.get_dist_info() == (True, 1, 1, 2)
    from_env = next(prepare_module.make_dataloader(tokenizer, 2, 64, "val", buffer_size=50))
    explicit = next(prepare_module.make_dataloader(tokenizer, 2, 64, "val", rank=1, world_size=2, buffer_size=50))
    assert torch.equal(from_env[0], explicit[0]) and from_env[2] == explicit[2]


def test_unknown_split_is_refused(tokenizer, prepare_module) -> None:
    with pytest.raises(prepare_module.PrepareError, match="split 'test'"):
        next(prepare_module.make_dataloader(tokenizer, 2, 64, "test"))


def test_disk_full_is_a_clear_error_with_nothing_trusted(prepare_module, tmp_path: Path, monkeypatch) -> None:
    import errno

    source = tmp_path / "corpus"
    source.mkdir()
    (source / "docs.jsonl").write_text("".join(json.dumps({"text": f"Document {i}."}) + "\n" for i in range(50)))

    def full_disk(path: Path, texts: list[str]) -> None:
        path.with_name(path.name + ".partial").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(prepare_module, "_write_parquet", full_disk)
    home = tmp_path / "home"
    with pytest.raises(prepare_module.PrepareError, match="disk full while writing under .*local-corpus; free space"):
        prepare_module.setup("local", path=source, home=home)
    assert not list(home.rglob("manifest.json")) and not (home / "active").exists()
    assert not list(home.rglob("*.parquet"))


# ---------------------------------------------------------------------------- a user's own split


@pytest.mark.parametrize(
    "rule, expected",
    [
        ("line", ["first line", "  second, indented", "third", "fourth"]),
        ("paragraph", ["first line\n  second, indented", "third\nfourth"]),
        ("file", ["first line\r\n  second, indented\r\n\r\n \t\nthird\nfourth\n"]),
    ],
)
def test_document_rules_keep_a_users_documents(rule, expected, prepare_module, tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"first line\r\n  second, indented\r\n\r\n \t\nthird\nfourth\n")
    assert list(prepare_module.local_documents(path, rule)) == expected


def test_parquet_rule_reads_text_rows_and_refuses_other_files(prepare_module, tmp_path: Path) -> None:
    pq.write_table(pa.table({"text": ["one", "two"], "id": [1, 2]}), tmp_path / "a.parquet")
    assert list(prepare_module.local_documents(tmp_path, "parquet")) == ["one", "two"]
    (tmp_path / "b.txt").write_text("three")
    with pytest.raises(prepare_module.PrepareError, match="b.txt: --documents parquet reads only .parquet"):
        list(prepare_module.local_documents(tmp_path, "parquet"))


def test_val_path_keeps_the_users_split_exactly(tinyshakespeare: Path, prepare_module, tmp_path: Path) -> None:
    """A validation file inside the training folder is validation only; every paragraph
    lands in the split its file names, none moved by the hash rule."""
    paragraphs = [p for p in tinyshakespeare.read_text().split("\n\n") if p.strip()]
    source = tmp_path / "corpus"
    source.mkdir()
    (source / "train.txt").write_text("\n\n".join(paragraphs[:-300]))
    (source / "valid.txt").write_text("\n\n".join(paragraphs[-300:]))
    home = tmp_path / "home"
    result = prepare_module.setup(
        "local", path=source, home=home, val_path=source / "valid.txt", documents="paragraph"
    )
    shards = home / "datasets" / "local-corpus" / "shards"
    read = lambda pattern: [t for f in sorted(shards.glob(pattern)) for t in pq.read_table(f).column("text").to_pylist()]  # noqa: E731
    assert read("public_val_*.parquet") == [p.strip("\n") for p in paragraphs[-300:]]
    assert read("train_*.parquet") == [p.strip("\n") for p in paragraphs[:-300]]
    assert result["documents"] == len(paragraphs)
    # Without --val-path, or with another rule, the same folder is another configuration (a rebuild).
    fingerprint = prepare_module._source_fingerprint
    chosen = fingerprint("local", source, 1, source / "valid.txt", "paragraph")
    assert chosen != fingerprint("local", source, 1, None, "paragraph") != fingerprint("local", source, 1)
    assert fingerprint("local", source, 1) == {"source": "local", "path": str(source), "files": chosen["files"] + [["valid.txt", *chosen["val_files"][0][1:]]]}


def test_val_path_and_document_rules_need_a_local_source(prepare_module, tmp_path: Path) -> None:
    with pytest.raises(prepare_module.PrepareError, match="apply to --source local"):
        prepare_module.setup("sample", home=tmp_path, documents="line")
    with pytest.raises(prepare_module.PrepareError, match="unknown rule"):
        prepare_module.setup("local", path=tmp_path, home=tmp_path, documents="sentence")
