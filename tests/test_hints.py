"""The lines trnf prints for the user to type next carry the trusted prepare.py in use."""

from __future__ import annotations

from pathlib import Path

import pytest

from trnfrontier.hints import trnf_line
from trnfrontier.kit import train_kit
from trnfrontier.runtime.prepare_loader import PREPARE_ENV


def test_a_kit_restart_line_keeps_the_kits_prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `trnf --prepare prepare.py train --train-py ...` exports the resolved path; the restart
    # line must name it, or the rerun would train against trnf's own prepare.py.
    kit_prepare = tmp_path / "kit dir" / "prepare.py"
    monkeypatch.setenv(PREPARE_ENV, str(kit_prepare))
    options = train_kit.KitOptions(Path("train.py"), nproc=4, lnc=2)
    line = train_kit.rerun_command(options, tmp_path / "r1")
    assert line == f"trnf --prepare '{kit_prepare}' train --train-py train.py --nproc 4 --lnc 2 --out {tmp_path / 'r1'}"


def test_without_a_chosen_prepare_the_line_is_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PREPARE_ENV, raising=False)
    assert trnf_line("train", "--resume", "runs/x") == "trnf train --resume runs/x"


def test_the_projects_own_prepare_is_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    from trnfrontier.trusted_prepare import default_prepare_path

    monkeypatch.setenv(PREPARE_ENV, str(default_prepare_path()))
    assert trnf_line("verify", "s.tar") == "trnf verify s.tar"
