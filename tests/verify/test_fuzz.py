"""Seeded corruption of a valid archive's members and bytes: verify reports, never raises."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from verify_kit import build_archive, good_meta, pins_file

import trnfrontier.verify.runner as runner
from trnfrontier import submission as fmt
from trnfrontier.verify.report import passed

TARGETS = [fmt.CHECKPOINT_SAFETENSORS, fmt.CHECKPOINT_FINAL_PT, fmt.TRAIN_PY, fmt.STEP_LOG, fmt.LAUNCH_FILE]


def _corrupt(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    mode = rng.choice(["flip", "truncate", "nul"])
    if mode == "flip":
        for _ in range(rng.randint(1, 20)):
            out[rng.randrange(min(len(out), 4096))] = rng.randrange(256)
    elif mode == "truncate":
        out = out[: rng.randrange(len(out))]
    else:
        out[rng.randrange(len(out))] = 0
    return bytes(out)


def test_corrupted_archives_never_crash_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The contract probe is stubbed: this test is about the static checks on hostile bytes.
    monkeypatch.setattr(runner, "_contract_check", lambda *a, **k: passed("contract", "stubbed"))
    build_archive(tmp_path)
    src = tmp_path / "submission.tar.src"
    originals = {name: fmt.member_path(src, name).read_bytes() for name in TARGETS}
    pins = pins_file(tmp_path)
    for seed in range(20):
        rng = random.Random(seed)
        target = TARGETS[seed % len(TARGETS)]
        for name in TARGETS:
            fmt.member_path(src, name).write_bytes(_corrupt(originals[name], rng) if name == target else originals[name])
        files = {n: fmt.member_path(src, n) for n in fmt.REQUIRED_MEMBERS if n != fmt.MANIFEST}
        out = tmp_path / f"fuzz{seed}.tar"
        fmt.write_deterministic_tar({**files, fmt.MANIFEST: fmt.manifest_bytes(fmt.build_manifest(files, **good_meta()))}, out)
        if seed % 3 == 0:  # and the tar's own bytes
            raw = bytearray(out.read_bytes())
            for _ in range(5):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            out.write_bytes(bytes(raw))
        report = runner.verify_archive(out, runner.Options(pins_file=pins))
        assert report.checks and all(c.reason and "\n" not in c.reason for c in report.checks)
