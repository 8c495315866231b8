"""Run the probe (``probe.py``) in a subprocess with a time limit: the only place archive code executes.

The child runs through ``processes.run_tree``: on timeout the whole tree (the child and
anything it started) is killed, not just the direct child. Its output is a
JSON file; a crash or a kill leaves none and is reported with the stderr tail.
"""

from __future__ import annotations

import json
import os
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
    """Run ``cmd`` with ``processes.run_tree``: the whole tree (torchrun's workers, in
    sessions of their own, included) is killed on timeout. Returns (returncode or None on
    timeout, the last 4000 bytes of stdout+stderr)."""
    done = processes.run_tree(cmd, cwd=cwd, env=env, timeout=timeout, merge_stderr=True, tail_bytes=4000)
    return done.returncode, done.stdout


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
