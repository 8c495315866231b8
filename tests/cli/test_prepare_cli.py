"""`trnf prepare`: the summary (table or JSON), the prepare.py it used, and one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli_run import run_cli
from trnfrontier.runtime.prepare_loader import PREPARE_ENV, sha256_file

REPO_ROOT = Path(__file__).resolve().parents[2]

FAKE_PREPARE = '''
class PrepareError(Exception):
    pass


def setup(source="climbmix", path=None, num_train_shards=1, home=None, progress=None):
    if source == "local":
        raise PrepareError("--path {}: the organisers' copy refuses local data".format(path))
    if progress:
        progress("download", 5, 10, "B")
        progress("download", 10, 10, "B")
    return {"source": source, "documents": 3, "bytes": 30, "tokens": 12, "bytes_per_token": 3.333,
            "tokenizer_sha256": "f" * 64, "num_train_shards": num_train_shards}
'''


@pytest.fixture()
def projects_prepare(monkeypatch: pytest.MonkeyPatch, restore_prepare_module: None) -> Path:
    monkeypatch.delenv(PREPARE_ENV, raising=False)
    return REPO_ROOT / "prepare.py"


def test_json_summary_names_the_data_and_the_prepare_py(sample_home: Path, projects_prepare: Path, capsys) -> None:
    code, out, _ = run_cli(["prepare", "--source", "sample", "--json"], capsys)
    assert code == 0
    summary = json.loads(out)
    manifest = json.loads((sample_home / "datasets" / "sample" / "manifest.json").read_text())
    assert summary["reused"] is True and summary["source"] == "sample"
    assert summary["documents"] == manifest["documents"] and summary["tokens"] == manifest["tokens"]
    assert summary["tokenizer_sha256"] == manifest["tokenizer"]["artifact_sha256"]  # the shipped artifact's pin
    assert summary["prepare_sha256"] == sha256_file(projects_prepare)
    assert Path(summary["prepare_path"]) == projects_prepare.resolve()


def test_tokenizer_options_reach_setup(sample_home: Path, projects_prepare: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    # With a good artifact, --build-tokenizer-if-missing changes nothing: the sample dataset is reused.
    code, out, _ = run_cli(["prepare", "--source", "sample", "--tokenizer", "shipped", "--build-tokenizer-if-missing", "--json"], capsys)
    assert code == 0
    summary = json.loads(out)
    assert summary["reused"] is True and summary["tokenizer"] == "shipped"
    assert summary["tokenizer_path"] == str(sample_home / "tokenizer" / "tokenizer.pkl")
    other = tmp_path / "organisers" / "prepare.py"  # a setup() without the option
    other.parent.mkdir()
    other.write_text(FAKE_PREPARE)
    monkeypatch.setenv(PREPARE_ENV, str(other))
    code, out, err = run_cli(["--prepare", str(other), "prepare", "--tokenizer", "trained"], capsys)
    assert code == 1 and "takes no 'tokenizer', so --tokenizer cannot be used with it" in err


def test_table_lists_every_figure(sample_home: Path, projects_prepare: Path, capsys) -> None:
    code, out, _ = run_cli(["prepare", "--source", "sample"], capsys)
    assert code == 0
    for label in ("source", "documents", "bytes", "tokens", "bytes/token", "tokenizer", "shipped", "tokenizer SHA256", "prepare.py SHA256"):
        assert label in out
    flat = re.sub(r"[\s│]", "", out)  # an 80-column console folds the hash over two table lines
    assert sha256_file(projects_prepare) in flat


def test_bad_local_path_is_one_line(projects_prepare: Path, tmp_path: Path, capsys) -> None:
    code, out, err = run_cli(["prepare", "--source", "local", "--path", str(tmp_path / "missing")], capsys)
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [f"trnf: error: --path {tmp_path / 'missing'}: no such file or directory; "
                                        "give a folder or file of .parquet, .jsonl or .txt"]


def test_another_prepare_py_is_used_and_fingerprinted(tmp_path: Path, monkeypatch, restore_prepare_module, capsys) -> None:
    other = tmp_path / "organisers" / "prepare.py"
    other.parent.mkdir()
    other.write_text(FAKE_PREPARE)
    monkeypatch.setenv(PREPARE_ENV, str(other))  # restored after the test; --prepare also sets it
    code, out, _ = run_cli(["--prepare", str(other), "prepare", "--num-train-shards", "2", "--json"], capsys)
    assert code == 0
    summary = json.loads(out)
    assert summary["prepare_sha256"] == sha256_file(other) and summary["num_train_shards"] == 2

    code, out, err = run_cli(["--prepare", str(other), "prepare", "--source", "local", "--path", "x"], capsys)
    assert code == 1 and err.strip() == "trnf: error: --path x: the organisers' copy refuses local data"


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--source", "banana"], "--source banana: unknown source; choose one of climbmix, local, sample"),
        (["--source", "local"], "--source local needs --path DIR"),
        (["--source", "sample", "--path", "somewhere"], "--path applies to --source local"),
        (["--source", "sample", "--num-train-shards", "2"], "--num-train-shards applies to --source climbmix"),
        (["--num-train-shards", "0"], "--num-train-shards 0: must be at least 1"),
        (["--source", "sample", "--documents", "line"], "--val-path and --documents apply to --source local"),
        (["--val-path", "v.txt"], "--val-path and --documents apply to --source local"),
        (["--tokenizer", "banana"], "--tokenizer banana: unknown; choose one of auto, shipped, trained"),
    ],
)
def test_contradictory_choices_are_usage_errors_on_one_line(args: list[str], expected: str, projects_prepare: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "home"))
    code, out, err = run_cli(["prepare", *args], capsys)
    assert code == 2 and out == ""
    assert err.splitlines() == [err.strip()] and err.startswith(f"trnf: error: {expected}")  # no blank line before it
    assert not (tmp_path / "home").exists()  # refused before any data was touched


def test_unwritable_home_is_one_line(projects_prepare: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("TRNF_HOME", str(blocker / "home"))  # below a file: every write fails
    code, out, err = run_cli(["prepare", "--source", "sample"], capsys)
    assert code == 1 and out == ""
    assert err.splitlines() == [err.strip()] and "cannot write the data under" in err and "Traceback" not in err
    code, _, err = run_cli(["--home", str(blocker), "prepare", "--source", "sample"], capsys)
    assert code == 2 and err.strip() == f"trnf: error: --home / TRNF_HOME {blocker}: not a directory; give the data and cache folder"


def test_local_with_a_validation_file_and_a_document_rule(
    projects_prepare: Path, tinyshakespeare: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    lines = tinyshakespeare.read_text().splitlines()
    (tmp_path / "train.txt").write_text("\n".join(lines[:-2000]))
    (tmp_path / "val.txt").write_text("\n".join(lines[-2000:]))
    monkeypatch.setenv("TRNF_HOME", str(tmp_path / "home"))
    code, out, _ = run_cli(
        ["prepare", "--source", "local", "--path", str(tmp_path / "train.txt"), "--val-path", str(tmp_path / "val.txt"),
         "--documents", "line", "--json"],
        capsys,
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["documents"] == sum(1 for line in lines if line.strip())
    assert summary["dataset"] == "local-train.txt" and summary["public_val_tokens"] > 0
