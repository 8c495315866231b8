"""Fault injection on prepared token files: truncated or flipped files are refused with one
line naming the file and the command that rebuilds it; complete data works on a read-only home."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trnfrontier.errors import TrnfError
from trnfrontier.recipes.loading import load_recipe

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def home(sample_home: Path, tmp_path: Path, monkeypatch) -> Path:
    """A private copy of the prepared sample home, selected for this test."""
    copy = tmp_path / "home"
    shutil.copytree(sample_home, copy)
    monkeypatch.setenv("TRNF_HOME", str(copy))
    monkeypatch.setenv("TRNF_DATASET", "sample")
    return copy


def _token_file(home: Path) -> Path:
    return home / "datasets" / "sample" / "tokens" / "train_00000.bin"


@pytest.mark.parametrize("cut", [2, 1], ids=["even length", "odd length"])
def test_truncated_token_file_is_refused_by_the_loader(home: Path, prepare_module, cut: int) -> None:
    path = _token_file(home)
    size = path.stat().st_size
    os.truncate(path, size - cut)
    tokenizer = prepare_module.ensure_tokenizer()
    with pytest.raises(prepare_module.PrepareError) as info:
        next(iter(prepare_module.make_dataloader(tokenizer, 2, 16, "train")))
    message = str(info.value)
    assert str(path) in message and f"{size:,}" in message
    assert "trnf prepare --source sample" in message and "\n" not in message


def test_flipped_byte_is_found_before_training(home: Path, prepare_module) -> None:
    path = _token_file(home)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    # The loader checks sizes only (every open); the full hash runs before `trnf train`.
    with pytest.raises(prepare_module.PrepareError, match="SHA256"):
        prepare_module.verify_token_files()
    from trnfrontier.train import plan

    with pytest.raises(TrnfError) as info:
        plan.check_can_train(load_recipe("cpu_smoke"))
    assert str(path) in str(info.value) and "trnf prepare --source sample" in str(info.value)
    # That the named repair (setup) rebuilds a damaged token file is
    # tests/test_prepare_data.py::test_damaged_file_is_rebuilt_with_the_same_tokenizer.


def test_verify_reports_what_it_hashed(home: Path, prepare_module) -> None:
    result = prepare_module.verify_token_files()
    manifest = json.loads((home / "datasets" / "sample" / "manifest.json").read_text())
    assert result["files"] == len(manifest["token_files"])
    assert result["bytes"] == sum(e["size"] for e in manifest["token_files"])


def _as_read_only(home: Path, argv: list[str]) -> list[str]:
    """``argv`` with ``home`` read-only: a read-only bind mount in a private mount namespace
    for root (who ignores file modes); a normal user's caller removes the write bits."""
    if os.geteuid() != 0:
        return argv
    script = f'mount --bind "{home}" "{home}" && mount -o remount,bind,ro "{home}" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh", *argv]


def _set_writable(home: Path, writable: bool) -> None:
    for path in [home, *home.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


def test_complete_data_prepares_on_a_read_only_home(home: Path) -> None:
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("root without unshare(1): no way to make a directory read-only for root")
        probe = _as_read_only(home, ["sh", "-c", f'! touch "{home}/probe" 2>/dev/null'])
        if subprocess.run(probe, capture_output=True).returncode != 0:
            pytest.skip("mount namespaces are not permitted here, so the home cannot be made read-only")
    code = (
        "from trnfrontier.runtime.prepare_loader import load_prepare; "
        f"p = load_prepare({str(REPO / 'prepare.py')!r}); "
        f"print(p.setup('sample', home={str(home)!r})['reused'])"
    )
    _set_writable(home, False)
    try:
        done = subprocess.run(
            _as_read_only(home, [sys.executable, "-c", code]),
            capture_output=True,
            text=True,
            env={**os.environ, "TRNF_DATASET": ""},
            timeout=300,
        )
    finally:
        _set_writable(home, True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
