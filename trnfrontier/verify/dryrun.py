"""`--dry-run`: run the archive's train.py for a few CPU steps in an environment with only the organisers' packages.

The harness is the kit's (``trnfrontier.kit.harness``: the clean venv, its environment,
the sandbox it runs in, loading the checkpoint back), shared with
`trnf train --train-py --dry-run`. The run is a copy of the archive's code (not its
checkpoint) in a temporary directory, under torchrun with the clean venv's interpreter
inside the sandbox.

Then the dry run compares what it saw with what the real launch implies, reading the run's
directory only through ``untrusted.hostfs`` (the run wrote it):

- train.py exits 0 (or finishes and a rank aborts in Python's shutdown, which is not its fault);
- it writes a checkpoint (``out/final.pt`` as the kit does, else the newest ``*.pt``;
  regular files only, no link followed);
- the step log, written through the trusted ``prepare.record_step_boundary`` as the real
  launch's clock is, records exactly the steps the dry run asked for;
- the checkpoint loads through ``load_for_eval`` in the clean environment, and the model it
  gives has the archive checkpoint's tensors (names and shapes): a train.py that trains
  another model when it is dry-run does not pass;
- all of it within the one ``timeout``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trnfrontier.contract.kit import CHECKPOINT as KIT_CHECKPOINT
from trnfrontier.kit import logs
from trnfrontier.kit.harness import (
    DRY_RUN_STEPS_ENV,
    build_clean_env,
    clean_environ,
    dry_run_jail,
    load_and_list,
    logged_boundaries,
)
from trnfrontier.submission import code_members, member_path
from trnfrontier.untrusted import hostfs, sandbox
from trnfrontier.verify.identity import normal_name


@dataclass
class DryRunResult:
    passed: bool
    reason: str
    output: str = ""  # the run's last output lines, for the report's notes (kept in memory, no file)


# torchrun's own report after a worker failed: rows of '=' or '-', its ChildFailedError, its
# traceback and summary fields; the line that says why is the worker's exception above them.
_TORCHRUN_NOISE = re.compile(r"^([=\-]{8,}|torch\.distributed\.elastic\S*Error\b.*|\S*ChildFailedError\b.*|\S+ FAILED|Failures:|"
                             r"Root Cause \(first observed failure\):|<NO_OTHER_FAILURES>|\[\d+\]:|raise ChildFailedError\(|"
                             r"File \"(\S*torch/distributed/\S*|<frozen runpy>)\", line \d+, in .*|Traceback \(most recent call last\):|"
                             r"(time|host|rank|exitcode|error_file|traceback)\s*:.*)$")
_EXIT_CODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def error_line(output: str) -> str:
    """The line of a failed dry run's output that says why: the worker's exception
    (``RuntimeError: ...``), not torchrun's closing banner; a worker that exited without one
    is named by its exit code; else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    line = logs.last_error_line([line for line in lines if not _TORCHRUN_NOISE.match(line)])
    codes = _EXIT_CODE.findall(output)
    if codes and not _EXCEPTION.match(line):
        return f"a worker exited {codes[0]} without an exception" + (f" (last output: {line})" if line else "")
    return line


def checkpoint_in(run_dir: Path) -> tuple[Path | None, str]:
    """The checkpoint a dry run wrote (the kit's out/final.pt, else the newest ``*.pt`` under
    ``run_dir``; regular files only, links never followed) or (None, why there is none)."""
    try:
        files = hostfs.find_files(run_dir)
    except hostfs.UnsafeFile as exc:
        return None, str(exc)
    kit = KIT_CHECKPOINT.as_posix()
    for rel, _ in files:
        if rel == kit:
            return run_dir / rel, ""
    found = sorted(((info.st_mtime, rel) for rel, info in files if rel.endswith(".pt")))
    return (run_dir / found[-1][1], "") if found else (None, "train.py finished but wrote no checkpoint (*.pt)")


def _same_model(expected: dict[str, list[int]] | None, report: dict[str, Any]) -> str | None:
    """Why the dry run's model differs from the archive's checkpoint (parameter names and shapes), or None.

    The real launch trained the archive's checkpoint; a dry run of the same script must
    build the same model (a CPU run may use another dtype, never another architecture)."""
    if expected is None:
        return None
    got = {normal_name(str(t.get("name"))): list(t.get("shape") or []) for t in report.get("tensors") or []
           if isinstance(t, dict) and t.get("kind") in ("parameter", "buffer")}
    if not got:
        return "the dry run's model lists no parameters"
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        name = missing[0] if missing else extra[0]
        where = "the archive's checkpoint has" if missing else "the dry run's model has"
        return f"{where} tensor {name[:80]!r} and the other does not ({len(missing)} missing, {len(extra)} extra)"
    for name in sorted(expected):
        if got[name] != list(expected[name]):
            return f"tensor {name[:80]!r} is {got[name]} in the dry run's model but {list(expected[name])} in the archive's checkpoint"
    return None


def _judge(run_dir: Path, python: Path, env: dict[str, str], steps: int, deadline: float, sandboxed: bool,
           expected: dict[str, list[int]] | None) -> tuple[str | None, str]:
    """After train.py exited: (why the dry run fails or None, what it saw)."""
    checkpoint, why = checkpoint_in(run_dir)
    if checkpoint is None:
        return why, ""
    rel = checkpoint.relative_to(run_dir)
    boundaries, none = logged_boundaries(run_dir)
    if not boundaries:
        return none, ""
    if boundaries[-1][0] + 1 != steps:
        return (f"the step log records {boundaries[-1][0] + 1} steps, the dry run asked for {steps}: train.py does not "
                f"stop where the launch tells it"), ""
    left = max(1.0, deadline - time.monotonic())
    loaded, detail, report = load_and_list(run_dir, checkpoint, python=python, env=env, timeout=left, sandboxed=sandboxed)
    if not loaded:
        return f"checkpoint {rel} does not load in the clean environment: {detail}", ""
    differs = _same_model(expected, report)
    if differs:
        return f"the dry run trained another model than the archive's checkpoint: {differs}", ""
    return None, f"{len(boundaries)} step boundaries, {rel} loads via load_for_eval without trnf ({detail})"


def dry_run(root: Path, names: list[str], work: Path, *, nproc: int, lnc: int, prepare: Path | None, steps: int, timeout: float,
            sandboxed: bool = True, expected: dict[str, list[int]] | None = None) -> DryRunResult:
    """Run the dry run under ``work`` (an empty temporary directory), inside the sandbox unless
    ``sandboxed`` is False, all of it (training and the load) within ``timeout`` seconds.
    ``expected``: the archive checkpoint's tensor shapes by name, which the dry run's model must have."""
    deadline = time.monotonic() + timeout
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
    done = sandbox.run_confined(cmd, dry_run_jail(work, run_dir, env, prepare), timeout=timeout, sandboxed=sandboxed)
    code, tail = done.code, done.output
    if done.breach:
        return DryRunResult(False, f"the dry run's process tree ran into {done.breach} and was stopped", tail)
    if code is None:
        return DryRunResult(False, f"train.py did not finish {steps} steps within {timeout:g} s ({DRY_RUN_STEPS_ENV}={steps}; "
                                   f"process group killed)", tail)
    exited = "exited 0"
    if code != 0:
        if not logs.aborted_after_finishing(tail):
            return DryRunResult(False, f"train.py exited {code} under torchrun x{nproc} (gloo, CPU): {error_line(tail)[:240]}", tail)
        # Not a failure of train.py: the checkpoint and load-back checks below still judge it.
        exited = f"finished (a rank then aborted in Python's shutdown: {logs.ABORT_WITHOUT_EXCEPTION})"
    why, saw = _judge(run_dir, python, env, steps, deadline, sandboxed, expected)
    if why:
        return DryRunResult(False, why, tail)
    return DryRunResult(True, f"{nproc} process(es), gloo on CPU, {DRY_RUN_STEPS_ENV}={steps}: {exited}, {saw}")
