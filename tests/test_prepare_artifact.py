"""The tokenizer artifact prepare.py ships beside itself: its pin, its rebuild, and setup's
use of it (a damaged or missing artifact, --build-tokenizer-if-missing, --tokenizer)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_prepare_download import TINY_BACKOFF, FaultyServer, climbmix_files

REPO = Path(__file__).resolve().parents[1]
ARTIFACT = REPO / "artifacts" / "tokenizer.zip"


@pytest.fixture(scope="module")
def builder():
    """scripts/build_tokenizer_artifact.py, loaded by path."""
    spec = importlib.util.spec_from_file_location("build_tokenizer_artifact", REPO / "scripts" / "build_tokenizer_artifact.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_artifact_matches_its_pin_and_holds_the_kit_vocabulary(prepare_module) -> None:
    assert hashlib.sha256(ARTIFACT.read_bytes()).hexdigest() == prepare_module.TOKENIZER_ARTIFACT_SHA256
    assert ARTIFACT.stat().st_size < 300_000  # small enough to commit
    data, sha = prepare_module.read_tokenizer_artifact()
    assert sha == prepare_module.TOKENIZER_ARTIFACT_SHA256
    tokenizer = prepare_module.Tokenizer.from_pickle_bytes(data)
    assert tokenizer.get_vocab_size() == 8192 and tokenizer.get_bos_token_id() == 8188
    assert [tokenizer.encode_special(s) for s in prepare_module.SPECIAL_TOKENS] == [8188, 8189, 8190, 8191]
    assert tokenizer.decode(tokenizer.encode("Return the value of x.")) == "Return the value of x."


def test_artifact_bytes_are_deterministic(prepare_module, builder) -> None:
    texts = builder.training_texts(prepare_module)[:400]
    first = builder.artifact_bytes(prepare_module, texts, vocab_size=600)
    assert builder.artifact_bytes(prepare_module, texts, vocab_size=600) == first
    with zipfile.ZipFile(io.BytesIO(first)) as archive:
        assert [i.filename for i in archive.infolist()] == ["tokenizer.pkl", "provenance.json"]
        assert {i.date_time for i in archive.infolist()} == {builder.FIXED_TIME}


def test_rebuilding_the_artifact_gives_the_committed_bytes(prepare_module, builder) -> None:
    """Byte-identical whenever this interpreter's documentation text is the text it was built from."""
    with zipfile.ZipFile(ARTIFACT) as archive:
        recorded = json.loads(archive.read("provenance.json"))
    texts = builder.training_texts(prepare_module)
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    if digest.hexdigest() != recorded["text_sha256"]:
        pytest.skip(f"this Python's documentation text differs from the artifact's (built on Python {recorded['python']})")
    assert builder.artifact_bytes(prepare_module, texts) == ARTIFACT.read_bytes()


def _damaged_copy(tmp_path: Path, how: str) -> Path:
    """prepare.py with its artifacts/ copied aside, the artifact with one byte flipped or removed."""
    kit = tmp_path / "kit"
    (kit / "artifacts").mkdir(parents=True)
    shutil.copyfile(REPO / "prepare.py", kit / "prepare.py")
    if how == "flipped":
        data = bytearray(ARTIFACT.read_bytes())
        data[len(data) // 2] ^= 0x01
        (kit / "artifacts" / "tokenizer.zip").write_bytes(bytes(data))
    return kit


@pytest.mark.parametrize("how, said", [("flipped", "has SHA256"), ("missing", "is missing")])
def test_a_bad_artifact_stops_setup_with_one_line(tmp_path: Path, how: str, said: str) -> None:
    kit = _damaged_copy(tmp_path, how)
    env = {"PATH": "/usr/bin:/bin", "TRNF_HOME": str(tmp_path / "home"), "TRNF_CLIMBMIX_URL": "http://127.0.0.1:9/unused"}
    done = subprocess.run([sys.executable, str(kit / "prepare.py"), "setup", "--num-train-shards", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert said in lines[0] and "tokenizer.zip" in lines[0] and "--build-tokenizer-if-missing" in lines[0]
    # Outside a clone of the project, git cannot restore it: the line says what can.
    assert "git checkout" not in lines[0] and "copy the artifacts/ folder that came with this prepare.py" in lines[0]
    assert not (tmp_path / "home").exists()  # refused before anything was downloaded or written


def test_in_a_clone_the_artifact_is_restored_with_git(prepare_module, tmp_path: Path) -> None:
    fake_clone = tmp_path / "clone"
    (fake_clone / ".git").mkdir(parents=True)
    with pytest.raises(prepare_module.PrepareError, match="restore it with `git checkout -- artifacts/`"):
        prepare_module.read_tokenizer_artifact(fake_clone / "artifacts" / "tokenizer.zip")


def test_build_tokenizer_if_missing_trains_one_from_the_downloaded_shards(
        prepare_module, sample_home, tmp_path, monkeypatch, capsys) -> None:
    kit = _damaged_copy(tmp_path, "flipped")
    monkeypatch.setattr(prepare_module, "tokenizer_artifact_path", lambda: kit / "artifacts" / "tokenizer.zip")
    home = tmp_path / "home"
    monkeypatch.setenv("TRNF_HOME", str(home))
    monkeypatch.setenv("TRNF_DATASET", "climbmix")
    with FaultyServer(climbmix_files(prepare_module, sample_home)) as running:
        monkeypatch.setenv("TRNF_CLIMBMIX_URL", running.url)
        monkeypatch.setenv("TRNF_DOWNLOAD_BACKOFF", str(TINY_BACKOFF))
        assert prepare_module.main(["setup", "--num-train-shards", "1", "--build-tokenizer-if-missing"]) == 0
    summary = json.loads(capsys.readouterr().out)
    manifest = json.loads((home / "datasets" / "climbmix" / "manifest.json").read_text())
    assert summary["tokenizer"] == manifest["tokenizer"]["origin"] == "trained"
    assert "has SHA256" in manifest["tokenizer"]["why"] and manifest["config"]["tokenizer"] == "trained"
    assert summary["tokenizer_path"] == str(home / "datasets" / "climbmix" / "tokenizer" / "tokenizer.pkl")
    assert not (home / "tokenizer").exists()  # the kit's place holds only the shipped tokenizer
    tokenizer = prepare_module.ensure_tokenizer()
    assert tokenizer.get_bos_token_id() == 8188
    assert tokenizer.sha256 == summary["tokenizer_sha256"] == manifest["tokenizer"]["sha256"]


def test_with_a_good_artifact_the_flag_changes_nothing(prepare_module, sample_home) -> None:
    again = prepare_module.setup("sample", home=sample_home, build_tokenizer_if_missing=True)
    assert again["reused"] is True and again["tokenizer"] == "shipped"


def test_a_local_source_trains_its_own_or_uses_the_shipped_one(prepare_module, sample_home, tmp_path) -> None:
    shards = sample_home / "datasets" / "sample" / "shards"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [text for role in ("train", "public_val")
             for text in pq.read_table(shards / f"{role}_00000.parquet").column("text").to_pylist()[:150]]
    pq.write_table(pa.table({"text": texts}), corpus / "a.parquet")
    home = tmp_path / "home"
    shipped = prepare_module.setup("local", path=corpus, home=home, tokenizer="shipped")
    assert shipped["tokenizer"] == "shipped" and shipped["tokenizer_sha256"] == prepare_module.TOKENIZER_ARTIFACT_SHA256
    assert shipped["tokenizer_path"] == str(home / "tokenizer" / "tokenizer.pkl")
    own = prepare_module.setup("local", path=corpus, home=home)  # the default: a BPE of the corpus itself
    assert own["reused"] is False and own["tokenizer"] == "trained"
    assert own["tokenizer_path"] == str(home / "datasets" / "local-corpus" / "tokenizer" / "tokenizer.pkl")
    assert own["tokenizer_sha256"] == hashlib.sha256(Path(own["tokenizer_path"]).read_bytes()).hexdigest()
    assert (home / "tokenizer" / "tokenizer.pkl").read_bytes() == prepare_module.read_tokenizer_artifact()[0]
    # A damaged file names the command that rebuilds this same dataset (its tokenizer choice included).
    (home / "datasets" / "local-corpus" / "tokens" / "train_00000.bin").write_bytes(b"")
    with pytest.raises(prepare_module.PrepareError, match=re.escape(f"rerun `trnf prepare --source local --path {corpus}`")):
        prepare_module.verify_token_files("local-corpus", home=home)
    manifest = json.loads((home / "datasets" / "local-corpus" / "manifest.json").read_text())
    shipped_manifest = {**manifest, "config": {**manifest["config"], "tokenizer_artifact_sha256": "x"}}
    assert prepare_module._repair_command(shipped_manifest).endswith("--tokenizer shipped")
    with pytest.raises(prepare_module.PrepareError, match="--tokenizer bogus: unknown"):
        prepare_module.setup("local", path=corpus, home=home, tokenizer="bogus")


@pytest.mark.parametrize("edit, said", [
    (lambda entry: entry.update(artifact_sha256="f" * 64), "prepared with another tokenizer artifact"),
    # What an older prepare.py wrote: a per-dataset tokenizer, no origin, no artifact.
    (lambda entry: [entry.pop(k) for k in ("origin", "artifact", "artifact_sha256")], "prepared by an older prepare.py"),
])
def test_a_dataset_from_another_or_no_artifact_is_refused_before_training(
        prepare_module, sample_home, tmp_path, monkeypatch, edit, said) -> None:
    home = tmp_path / "home"
    shutil.copytree(sample_home, home)
    manifest_path = home / "datasets" / "sample" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    edit(manifest["tokenizer"])
    manifest_path.write_text(json.dumps(manifest))
    monkeypatch.setenv("TRNF_HOME", str(home))
    fix = "rerun `trnf prepare --source sample`"
    with pytest.raises(prepare_module.PrepareError, match=f"{said}.*{re.escape(fix)}"):
        prepare_module.ensure_tokenizer()
    with pytest.raises(prepare_module.PrepareError, match=said):
        prepare_module.verify_token_files()  # what `trnf train` checks before it starts
    assert prepare_module.setup("sample", home=home)["reused"] is False  # the fix works
    assert prepare_module.ensure_tokenizer().sha256 == prepare_module.TOKENIZER_ARTIFACT_SHA256
