"""Fault injection on checkpoints: a flipped byte or a cut file in model.safetensors, final.pt
or a resumable checkpoint is refused with one line naming the file and what to do."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.runtime.test_checkpoint import save_step, trained
from trnfrontier.runtime import checkpoint as ck
from trnfrontier.runtime.integrity import DamagedFileError, check_directory
from trnfrontier.runtime.rundir import MANIFEST_FILE


def flip_byte(path: Path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0x01
    path.write_bytes(bytes(data))


def test_checkpoints_carry_a_manifest_of_every_file(tmp_path: Path) -> None:
    model, opts = trained()
    step = save_step(tmp_path, 1, model, opts)
    final = ck.save_final(tmp_path, model, {"step": 1})
    for directory in (step, final):
        listed = json.loads((directory / MANIFEST_FILE).read_text())["files"]
        on_disk = {p.name for p in directory.iterdir()} - {MANIFEST_FILE}
        assert set(listed) == on_disk
        for name, entry in listed.items():
            assert entry["size"] == (directory / name).stat().st_size
        assert check_directory(directory) is True


@pytest.mark.parametrize("name", [ck.MODEL_FILE, ck.KIT_FILE, ck.META_FILE])
def test_flipped_byte_in_final_is_refused(tmp_path: Path, name: str) -> None:
    model, _ = trained()
    final = ck.save_final(tmp_path, model, {"step": 1})
    flip_byte(final / name, 0.9)  # late in the file: tensor data, not the header
    target = final / (ck.KIT_FILE if name == ck.KIT_FILE else ck.MODEL_FILE)
    with pytest.raises(DamagedFileError) as info:
        ck.load_for_eval(str(target), "cpu")
    message = str(info.value)
    assert str(final / name) in message and "SHA256" in message and "\n" not in message


def test_truncated_final_is_refused_with_both_sizes(tmp_path: Path) -> None:
    model, _ = trained()
    final = ck.save_final(tmp_path, model, {"step": 1})
    size = (final / ck.MODEL_FILE).stat().st_size
    os.truncate(final / ck.MODEL_FILE, size - 2)
    with pytest.raises(DamagedFileError, match=f"{size - 2:,} bytes, its manifest says {size:,}"):
        ck.load_model(tmp_path)


def test_resume_from_a_damaged_checkpoint_names_the_earlier_one(tmp_path: Path) -> None:
    model, opts = trained()
    save_step(tmp_path, 1, model, opts)
    latest = save_step(tmp_path, 2, model, opts)
    flip_byte(latest / ck.OPTIM_FILE)
    fresh, fresh_opts = trained(seed=1)
    with pytest.raises(DamagedFileError) as info:
        ck.load_checkpoint(latest, fresh, fresh_opts, torch.device("cpu"))
    message = str(info.value)
    assert str(latest / ck.OPTIM_FILE) in message and "step_000001" in message
    # Following the advice works: the earlier checkpoint loads.
    ck.load_checkpoint(ck.list_checkpoints(tmp_path)[0], fresh, fresh_opts, torch.device("cpu"))


def test_a_kit_final_pt_without_manifest_still_loads(tmp_path: Path) -> None:
    """Someone else's checkpoint (the organisers' train.py) has no manifest: no check."""
    model, _ = trained()
    final = ck.save_final(tmp_path, model, {"step": 1})
    (final / MANIFEST_FILE).unlink()
    assert ck.load_model(final / ck.KIT_FILE).config == model.config


def test_a_garbled_manifest_is_a_damaged_file(tmp_path: Path) -> None:
    model, _ = trained()
    final = ck.save_final(tmp_path, model, {"step": 1})
    (final / MANIFEST_FILE).write_text('{"files": {"model.safetensors": 3}}')
    with pytest.raises(DamagedFileError, match="unreadable manifest"):
        ck.load_model(final)


def test_check_weights_is_strict_where_trnf_wrote_the_directory(tmp_path: Path) -> None:
    """The tool's check before a score: a trnf checkpoint without its manifest is refused;
    a kit's own final.pt (no trnf meta.json beside it) is reported as unchecked."""
    from trnfrontier.runtime.integrity import check_weights

    model, _ = trained()
    final = ck.save_final(tmp_path / "run", model, {"step": 1})
    assert "checked against" in str(check_weights(final / ck.KIT_FILE))
    flip_byte(final / ck.META_FILE, 0.5)
    with pytest.raises(DamagedFileError, match="meta.json is damaged"):
        check_weights(final / ck.MODEL_FILE)  # the settings a score reads are checked too
    (final / MANIFEST_FILE).unlink()
    with pytest.raises(DamagedFileError, match="manifest.json is damaged \\(missing"):
        check_weights(final / ck.KIT_FILE)
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / ck.KIT_FILE).write_bytes((final / ck.KIT_FILE).read_bytes())
    assert check_weights(kit / ck.KIT_FILE) is None


def test_resume_from_a_checkpoint_without_its_manifest_is_refused(tmp_path: Path) -> None:
    model, opts = trained()
    save_step(tmp_path, 1, model, opts)
    latest = save_step(tmp_path, 2, model, opts)
    (latest / MANIFEST_FILE).unlink()
    with pytest.raises(DamagedFileError, match="manifest.json is damaged \\(missing.*continue from step_000001"):
        ck.check_resumable(latest)
