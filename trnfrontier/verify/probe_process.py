"""``run_in_group``: a trusted command through ``processes.run_tree`` with a time limit.

Archive code never goes through here: it runs through ``sandbox.run`` and
``served.ServedModel``, inside bubblewrap.
"""

from __future__ import annotations

from pathlib import Path

from trnfrontier import processes


def run_in_group(cmd: list[str], *, cwd: Path, env: dict[str, str] | None, timeout: float) -> tuple[int | None, str]:
    """Run ``cmd`` with ``processes.run_tree``: the whole tree (torchrun's workers, in
    sessions of their own, included) is killed on timeout. Returns (returncode or None on
    timeout, the last 4000 bytes of stdout+stderr)."""
    done = processes.run_tree(cmd, cwd=cwd, env=env, timeout=timeout, merge_stderr=True, tail_bytes=4000)
    return done.returncode, done.stdout
