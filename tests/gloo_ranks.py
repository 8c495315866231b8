"""Start a script as N gloo ranks on this machine (the environment torchrun would give
each rank, without torchrun's agent: tests read each rank's own exit code and stderr)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world: int, port: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",
        **(extra or {}),
    }


def run_ranks(
    script: Path,
    world: int,
    args: Sequence[str] = (),
    *,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
) -> list[tuple[int, str, str]]:
    """Run ``python script args...`` as ``world`` ranks; (exit code, stdout, stderr) per rank."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            env=rank_env(rank, world, port, env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def assert_ranks_ok(results: list[tuple[int, str, str]]) -> None:
    for rank, (code, _, err) in enumerate(results):
        assert code == 0, f"rank {rank} exited {code}: {err[-3000:]}"


def torchrun_entry(
    recipe: Path, out: Path, nproc: int, *extra: str, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone --nproc_per_node N -m trnfrontier.runtime.entry`` for a run
    directory, as `trnf train --nproc N` starts it (with the repository's prepare.py)."""
    repo = Path(__file__).resolve().parents[1]
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
         "-m", "trnfrontier.runtime.entry", "--recipe", str(recipe), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        cwd=repo,
        env={**os.environ, "TRNF_PREPARE": str(repo / "prepare.py"), "OMP_NUM_THREADS": "1", **(env or {})},
        timeout=timeout,
        check=False,
    )
