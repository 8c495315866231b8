"""`--dry-run`: run the archive's train.py for a few CPU steps in an environment with only the organisers' packages.

The harness is the kit's (``trnfrontier.kit.harness``: the clean venv, its environment,
the sandbox it runs in, loading the checkpoint back), shared with
`trnf train --train-py --dry-run`. The run is a copy of the archive's code (not its
checkpoint) in a temporary directory, under torchrun with the clean venv's interpreter
inside the sandbox. train.py must exit 0 and write a checkpoint
(``contract.checkpoint.find_checkpoint``: ``out/final.pt`` as the kit does, else the newest
``*.pt`` up to three folders deep), which is then loaded through ``load_for_eval`` by the
model server, in the same clean environment.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from trnfrontier.contract.checkpoint import find_checkpoint
from trnfrontier.kit import logs
from trnfrontier.kit.harness import (
    DRY_RUN_STEPS_ENV,
    build_clean_env,
    clean_environ,
    dry_run_jail,
    load_back,
    logged_boundaries,
)
from trnfrontier.submission import code_members, member_path
from trnfrontier.untrusted import sandbox


@dataclass
class DryRunResult:
    passed: bool
    reason: str


# torchrun's own report after a worker failed: a row of '=' or '-', its ChildFailedError and
# the summary fields; the line that says why is the worker's exception above them.
_TORCHRUN_NOISE = re.compile(r"^([=\-]{8,}|torch\.distributed\.elastic\S*Error\b.*|\S*ChildFailedError\b.*)$")


def error_line(output: str) -> str:
    """The line of a failed dry run's output that says why: the worker's exception
    (``RuntimeError: ...``), not torchrun's closing banner; else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return logs.last_error_line([line for line in lines if not _TORCHRUN_NOISE.match(line)])


def keep_log(output: str) -> Path | None:
    """The output's tail in a file that outlives the dry run's temporary work directory,
    so the failure can name it (None when even that cannot be written)."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix="trnf-verify-dry-run-", suffix=".log")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(output)
    except OSError:
        return None
    return Path(name)


def _log_note(output: str) -> str:
    kept = keep_log(output)
    return f"; log (its last part): {kept}" if kept is not None else ""


def dry_run(root: Path, names: list[str], work: Path, *, nproc: int, lnc: int, prepare: Path | None, steps: int, timeout: float,
            sandboxed: bool = True) -> DryRunResult:
    """Run the dry run under ``work`` (an empty temporary directory), inside the sandbox unless ``sandboxed`` is False."""
    try:
        python = build_clean_env(work, prepare)
    except (subprocess.CalledProcessError, OSError, metadata.PackageNotFoundError) as exc:
        return DryRunResult(False, f"could not build the clean environment: {exc}")
    run_dir = work / "run"
    home = work / "home"
    home.mkdir()
    for name in code_members(names):  # the code, not the checkpoint or the logs
        target = member_path(run_dir, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(member_path(root, name), target)
    env = clean_environ(home, nproc, lnc, steps, run_dir)
    cmd = [str(python), "-I", "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "train.py"]
    code, tail = sandbox.run(cmd, dry_run_jail(work, run_dir, env, prepare), timeout=timeout, sandboxed=sandboxed)
    if code is None:
        return DryRunResult(False, f"train.py did not finish {steps} steps within {timeout:g} s ({DRY_RUN_STEPS_ENV}={steps}; "
                                   f"process group killed){_log_note(tail)}")
    exited = "exited 0"
    if code != 0:
        if not logs.aborted_after_finishing(tail):
            return DryRunResult(False, f"train.py exited {code} under torchrun x{nproc} (gloo, CPU): {error_line(tail)[:240]}{_log_note(tail)}")
        # Not a failure of train.py: the checkpoint and load-back checks below still judge it.
        exited = f"finished (a rank then aborted in Python's shutdown: {logs.ABORT_WITHOUT_EXCEPTION}{_log_note(tail)})"
    checkpoint = find_checkpoint(run_dir)
    if checkpoint is None:
        return DryRunResult(False, "train.py finished but wrote no checkpoint (*.pt)")
    loaded, why = load_back(run_dir, checkpoint, python=python, env=env, timeout=timeout, sandboxed=sandboxed)
    if not loaded:
        return DryRunResult(False, f"checkpoint {checkpoint.relative_to(run_dir)} does not load in the clean environment: {why}")
    boundaries = logged_boundaries(run_dir)
    return DryRunResult(
        True,
        f"{nproc} process(es), gloo on CPU, {DRY_RUN_STEPS_ENV}={steps}: {exited}, {len(boundaries)} step boundaries, "
        f"{checkpoint.relative_to(run_dir)} loads via load_for_eval without trnf",
    )
