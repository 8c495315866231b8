"""Loading the trusted prepare.py by path, and its fingerprint."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from trnfrontier.errors import TrnfError
from trnfrontier.runtime.prepare_loader import PREPARE_ENV, load_prepare, sha256_file
from trnfrontier.trusted_prepare import default_prepare_path, load_contract


def test_sha256_file_matches_hashlib(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path, chunk_size=4096) == hashlib.sha256(data).hexdigest()


def test_load_prepare_by_path_imports_it_as_prepare(tmp_path: Path, restore_prepare_module: None) -> None:
    other = tmp_path / "prepare.py"
    other.write_text("TRAIN_TIME_BUDGET_SECONDS = 1800\nMARK = 'organisers'\n")
    sys.modules.pop("prepare", None)
    module = load_prepare(other)
    assert module.MARK == "organisers"
    assert sys.modules["prepare"] is module
    assert load_prepare(other) is module  # loaded once per process
    import prepare

    assert prepare is module


def test_runtime_refuses_a_second_contract_in_one_process(tmp_path: Path, restore_prepare_module: None) -> None:
    first, second = tmp_path / "a" / "prepare.py", tmp_path / "b" / "prepare.py"
    for path in (first, second):
        path.parent.mkdir()
        path.write_text("X = 1\n")
    sys.modules.pop("prepare", None)
    load_prepare(first)
    with pytest.raises(ImportError, match="different prepare.py"):
        load_prepare(second)


def test_contract_file_must_be_named_prepare(tmp_path: Path, restore_prepare_module: None) -> None:
    odd = tmp_path / "organisers_prepare.py"
    odd.write_text("X = 1\n")
    sys.modules.pop("prepare", None)
    with pytest.raises(ImportError, match="must be named prepare.py"):
        load_prepare(odd)


def test_load_contract_uses_env_and_reports_sha(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_prepare_module: None) -> None:
    other = tmp_path / "prepare.py"
    other.write_text("X = 1\n")
    monkeypatch.setenv(PREPARE_ENV, str(other))
    contract = load_contract()
    assert contract.path == other.resolve()
    assert contract.sha256 == hashlib.sha256(other.read_bytes()).hexdigest()


def test_broken_prepare_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_prepare_module: None) -> None:
    bad = tmp_path / "prepare.py"
    bad.write_text("def broken(:\n")
    monkeypatch.setenv(PREPARE_ENV, str(bad))
    with pytest.raises(TrnfError, match="does not parse"):
        load_contract()


def test_default_prepare_is_the_projects() -> None:
    path = default_prepare_path()
    assert path.name == "prepare.py"
    assert path.parent == Path(__file__).resolve().parents[1]


def test_a_run_records_the_prepare_pys_own_tokenizer_sha_else_its_artifact(tmp_path: Path) -> None:
    import types

    from trnfrontier.trusted_prepare import TrustedContract, recorded_tokenizer_sha256

    path = tmp_path / "prepare.py"
    path.write_text("")
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "tokenizer.zip").write_bytes(b"zip")
    shipped = hashlib.sha256(b"zip").hexdigest()

    def contract(module: object) -> TrustedContract:
        return TrustedContract(module=module, path=path, sha256="0" * 64)

    def no_data() -> str:
        raise RuntimeError("no prepared dataset")

    # The project's prepare.py: its dataset's pin (a dataset with a tokenizer of its own differs from the artifact).
    assert recorded_tokenizer_sha256(contract(types.SimpleNamespace(tokenizer_sha256=lambda: "a" * 64))) == "a" * 64
    assert recorded_tokenizer_sha256(contract(types.SimpleNamespace(tokenizer_sha256=no_data))) == shipped
    assert recorded_tokenizer_sha256(contract(types.SimpleNamespace())) == shipped  # the organisers' kit
    (tmp_path / "artifacts" / "tokenizer.zip").unlink()
    assert recorded_tokenizer_sha256(contract(types.SimpleNamespace())) is None
