"""Checks before launch: the file exists, parses, defines load_for_eval, and imports the trusted prepare.py."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.kit import preflight

REPO_PREPARE = Path(__file__).resolve().parents[2] / "prepare.py"


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        preflight.check_train_py(tmp_path / "train.py")
    with pytest.raises(UsageError, match="not a file"):
        preflight.check_train_py(tmp_path)


def test_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text("def load_for_eval(p, d):\n    return None\n\nfor x in range(3)\n    pass\n")
    with pytest.raises(TrnfError, match=r"train.py:4: syntax error") as raised:
        preflight.check_train_py(path)
    assert "nothing was launched" in str(raised.value)


def test_load_for_eval_must_be_defined(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text("def main():\n    load_for_eval = 1\n")  # a local name does not count
    with pytest.raises(TrnfError, match="defines no load_for_eval"):
        preflight.check_train_py(path)
    for source in ("def load_for_eval(p, d): ...", "from mylib import load_for_eval", "load_for_eval = make_loader()"):
        path.write_text(source + "\n")
        assert isinstance(preflight.check_train_py(path), ast.Module)


def test_record_step_boundary_mention() -> None:
    assert preflight.calls_record_step_boundary(ast.parse("import prepare\nprepare.record_step_boundary(1)"))
    assert preflight.calls_record_step_boundary(ast.parse("from prepare import record_step_boundary"))
    assert not preflight.calls_record_step_boundary(ast.parse("print('step 1')"))


def test_prepare_beside_must_be_the_trusted_one(tmp_path: Path) -> None:
    from trnfrontier.runtime.prepare_loader import sha256_file

    script = tmp_path / "train.py"
    script.write_text("def load_for_eval(p, d): ...\n")
    sha = sha256_file(REPO_PREPARE)
    preflight.check_prepare_beside(script, REPO_PREPARE, sha)  # none beside: fine
    shutil.copyfile(REPO_PREPARE, tmp_path / "prepare.py")
    preflight.check_prepare_beside(script, REPO_PREPARE, sha)  # identical copy: fine
    (tmp_path / "prepare.py").write_text("TRAIN_TIME_BUDGET_SECONDS = 99999\n")
    with pytest.raises(TrnfError, match="differs from the trusted prepare.py"):
        preflight.check_prepare_beside(script, REPO_PREPARE, sha)
