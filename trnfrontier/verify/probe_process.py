"""Run the probe (``probe.py``) in a subprocess with a time limit: the only place archive code executes.

The child gets its own session (process group), so on timeout the whole group (the
child and anything it started) is killed, not just the direct child. Its output is a
JSON file; a crash or a kill leaves none and is reported with the stderr tail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnfrontier import processes

PROBE = Path(__file__).with_name("probe.py")


@dataclass
class ProbeResult:
    data: dict[str, Any] | None
    error: str | None  # why there is no data (timeout, crash)


def run_in_group(cmd: list[str], *, cwd: Path, env: dict[str, str] | None, timeout: float) -> tuple[int | None, str]:
    """Run ``cmd`` in a new session; kill the whole group on timeout. Returns (returncode or None on timeout, output tail)."""
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            # The whole tree, torchrun's workers (in sessions of their own) included.
            processes.stop_tree(proc, grace=0.5)
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 4000))
        tail = log.read().decode("utf-8", "replace")
    return code, tail


def run_probe(
    mode: str,
    *,
    root: Path,
    checkpoint: Path,
    prepare: Path | None,
    timeout: float,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
) -> ProbeResult:
    """Run ``probe.py MODE`` on the archive at ``root`` (isolated mode: no user site, no PYTHONPATH)."""
    with tempfile.TemporaryDirectory(prefix="trnf-probe-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [python, "-I", str(PROBE), mode, "--train-py", str(root / "train.py"), "--checkpoint", str(checkpoint), "--out", str(out)]
        if prepare is not None:
            cmd += ["--prepare", str(prepare)]
        cmd += extra or []
        child_env = dict(env if env is not None else os.environ)
        child_env.setdefault("OMP_NUM_THREADS", "1")
        code, tail = run_in_group(cmd, cwd=root, env=child_env, timeout=timeout)
        if code is None:
            return ProbeResult(None, f"timed out after {timeout:g} s (process group killed)")
        if not out.is_file():
            last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
            return ProbeResult(None, f"the probe died (exit {code}): {last[:300]}")
        try:
            return ProbeResult(json.loads(out.read_text()), None)
        except json.JSONDecodeError:
            return ProbeResult(None, "the probe wrote an unreadable result")
