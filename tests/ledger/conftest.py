"""Fixtures shared by the ledger tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture()
def ledger_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ledger and a working directory whose runs/ holds the run directories."""
    monkeypatch.setenv("TRNF_LEDGER", str(tmp_path / "ledger.sqlite"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    return tmp_path / "runs"
