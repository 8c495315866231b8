"""A real small tmpfs for full-disk tests, where mounting is permitted (root with mount
namespaces): ``small_tmpfs`` wraps a command so it runs with the tmpfs mounted in a private
mount namespace (gone with the command); ``tmpfs_or_skip`` skips the test elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def small_tmpfs(mount: Path, size: str, argv: list[str]) -> list[str]:
    """``argv`` run with a ``size`` tmpfs on ``mount``; afterwards it lists what the tmpfs
    holds, on stdout (exit 99: the mount failed)."""
    script = f'mount -t tmpfs -o size={size} tmpfs "{mount}" || exit 99; "$@"; rc=$?; ls -A "{mount}"; exit $rc'
    return ["unshare", "-m", "sh", "-c", script, "sh", *argv]


def tmpfs_or_skip(mount: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("mounting a small tmpfs needs root and unshare(1); the injected-ENOSPC tests cover this")
    if subprocess.run(small_tmpfs(mount, "64k", ["true"]), capture_output=True).returncode != 0:
        pytest.skip("mount namespaces are not permitted here; the injected-ENOSPC tests cover this")
