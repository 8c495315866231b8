"""The kit harness: a kit-style train.py for a few CPU steps in an environment with only the
organisers' packages, inside the sandbox; both dry runs (`trnf train --train-py --dry-run`
on a team's file, `trnf verify --dry-run` on an archive's) run through it.

The clean environment (why it is trustworthy):
1. ``python -m venv --without-pip`` makes a fresh virtual environment. A venv never sees
   the base interpreter's site-packages nor the user site, so it starts with the
   standard library only.
2. Its site-packages receives *symlinks* to exactly the organisers' distributions
   (torch, numpy, tiktoken, pyarrow, plus torch-neuronx / nki / neuronx-cc / torch-xla
   where installed) and their runtime dependencies, found by walking
   ``importlib.metadata`` requirements (extras excluded, markers evaluated), and to the
   trusted prepare.py. Nothing else: ``import trnfrontier``, ``pydantic``, ``typer`` or
   ``rich`` raises ModuleNotFoundError. One stdlib module is added: ``trnf_exit_settle``
   (``trnfrontier.runtime.exit_settle``), which keeps torch's gloo threads from aborting a rank
   in Python's shutdown after train.py finished (a CPU stand-in's problem only).
3. torchrun runs under that venv's interpreter with ``-I`` (no PYTHONPATH, no user
   site) and a scrubbed environment, so the workers it spawns (``sys.executable``)
   are confined the same way.
4. All of it runs inside the sandbox (``untrusted.sandbox``): the run directory and the run's
   home are the only writable places (the venv beside them is read-only: the links verify
   reads from it are verify's), the prepared data and the trusted prepare.py are bound
   read-only, there is no network (torchrun and gloo talk over the sandbox's own loopback).
   Only the kit's own ``NEURON_COMPETITION_R1_*`` knobs (``contract.kit.KNOBS``) are passed
   in; what the run leaves is read back through ``untrusted.hostfs`` (no link followed, no
   FIFO opened, sizes capped).

train.py is told to be short through environment variables that packaged and kit-style
train.py files honour: ``TRNF_DRY_RUN_STEPS`` (stop after that many steps; the kit's own
``NEURON_COMPETITION_R1_NUM_STEPS`` too), ``TRNF_DEVICE=cpu`` and ``TRNF_DIST_BACKEND=gloo``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from trnfrontier.child_env import child_env
from trnfrontier.contract.allowed_imports import OPTIONAL_DISTRIBUTIONS, ORGANISER_DISTRIBUTIONS
from trnfrontier.contract.budget import no_step_log, unread_step_log
from trnfrontier.contract.kit import (
    COMPILE_ENV,
    ENV_PREFIX,
    EVAL_PUBLIC_ENV,
    KNOBS,
    NUM_STEPS_ENV,
    OUT_DIR_ENV,
)
from trnfrontier.contract.kit import STEP_LOG_ENV as KIT_STEP_LOG_ENV
from trnfrontier.contract.phases import DEFAULT_PHASE, Phase
from trnfrontier.contract.steplog import Boundary, StepLogError, read_step_log
from trnfrontier.runtime import exit_settle
from trnfrontier.runtime.data_home import KIT_CACHE_DIR_ENV
from trnfrontier.runtime.rundir import STEP_LOG_ENV, STEP_LOG_FILE
from trnfrontier.untrusted import hostfs, sandbox
from trnfrontier.untrusted.served import ServedModel, ServerError

DRY_RUN_STEPS_ENV = "TRNF_DRY_RUN_STEPS"
# What is read back of a dry run's step log, at most.
STEP_LOG_CAP = 16 << 20
# Phase 2's 64 or 128 ranks do not fit a CPU: its dry runs prove train.py on this many.
DRY_RUN_MAX_RANKS = 4


def dry_run_ranks(nproc: int, phase: Phase) -> int:
    """How many CPU ranks a dry run of an ``nproc``-process launch of ``phase`` starts: all of
    them for Phase 1 (at most one chip's 8), at most DRY_RUN_MAX_RANKS for another phase."""
    return nproc if phase.number == DEFAULT_PHASE else min(nproc, DRY_RUN_MAX_RANKS)


def kit_dry_run_env(steps: int, step_log: Path, parent: dict[str, str] | None = None) -> dict[str, str]:
    """The NEURON_COMPETITION_R1_* part of a dry run's environment.

    The team's own settings are forwarded; the kit's train.py is stopped with its own knob
    (NUM_STEPS), its in-process public eval and torch.compile(backend="neuron") are off
    unless the team set them (a CPU dry run cannot compile for Neuron, and 2M eval tokens
    would take longer than the run), and the step log goes where trnf reads it. The team's
    output folder is not forwarded: the dry run's checkpoint goes to the script's default
    (``out/`` in the dry run's own folder), never into a folder of the team's outside it."""
    source = os.environ if parent is None else parent
    env = {k: v for k, v in source.items() if k in KNOBS and k != OUT_DIR_ENV}
    env[NUM_STEPS_ENV] = str(steps)
    env.setdefault(EVAL_PUBLIC_ENV, "0")
    env.setdefault(COMPILE_ENV, "0")
    env[KIT_STEP_LOG_ENV] = str(step_log)
    return env


def _requirement_names(dist: metadata.Distribution) -> list[str]:
    names: list[str] = []
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - packaging ships with pip/setuptools everywhere
        Requirement = None  # type: ignore[assignment,misc]
    for spec in dist.requires or []:
        if Requirement is not None:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            names.append(req.name)
        elif "extra ==" not in spec:
            names.append(re.split(r"[\s;<>=!~\[(]", spec, maxsplit=1)[0])
    return names


def distribution_closure(roots: tuple[str, ...], optional: tuple[str, ...] = ()) -> list[metadata.Distribution]:
    """The installed distributions ``roots`` need at run time (``optional`` ones when installed)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(name, True) for name in roots] + [(name, False) for name in optional]
    while todo:
        name, required = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            if required:
                raise
            continue
        found[key] = dist
        todo.extend((dep, False) for dep in _requirement_names(dist))
    return list(found.values())


def _top_level_entries(dist: metadata.Distribution) -> set[Path]:
    """The site-packages entries a distribution installed (packages, modules, .libs, dist-info)."""
    entries: set[Path] = set()
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith(".pth"):
            continue
        entries.add(Path(str(dist.locate_file(parts[0]))))
    return {e for e in entries if e.exists()}


def build_clean_env(dest: Path, prepare: Path | None) -> Path:
    """Create the clean venv under ``dest``; returns its python."""
    venv = dest / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True, text=True).stdout.strip()
    )
    for dist in distribution_closure(ORGANISER_DISTRIBUTIONS, OPTIONAL_DISTRIBUTIONS):
        for entry in _top_level_entries(dist):
            link = site / entry.name
            if not link.exists():
                link.symlink_to(entry)
    if prepare is not None:
        (site / "prepare.py").symlink_to(prepare)
    exit_settle.add_to_site_packages(site)
    return python


def clean_environ(home: Path, nproc: int, lnc: int, steps: int, run_dir: Path) -> dict[str, str]:
    """The whole environment of a dry run (nothing inherited but where prepare.py finds the data)."""

    env = {
        "PATH": f"{home.parent / 'venv' / 'bin'}:/usr/bin:/bin",
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "NEURON_LOGICAL_NC_CONFIG": str(lnc),
        DRY_RUN_STEPS_ENV: str(steps),
        "TRNF_DEVICE": "cpu",
        "TRNF_DIST_BACKEND": "gloo",
        STEP_LOG_ENV: str(run_dir / STEP_LOG_FILE),
    }
    # The kit's knobs and step log; its data comes through NEURON_COMPETITION_R1_CACHE_DIR
    # (bound read-only in the jail, see data_paths).
    env.update(kit_dry_run_env(steps, run_dir / STEP_LOG_FILE))
    # The data a train.py reads comes through prepare.py, which finds it through TRNF_HOME:
    # forwarded even when unset here, since HOME above is not the user's (child_env).
    full = child_env(env)
    return {k: v for k, v in full.items() if not k.startswith(ENV_PREFIX) or k in KNOBS}


def data_paths(env: dict[str, str]) -> tuple[Path, ...]:
    """What a dry run with environment ``env`` reads besides code, bound read-only: the
    prepared datasets with the ClimbMix shards and unpacked tokenizer they reference
    (``data/``, ``tokenizer/``: the kit's layout), and the kit's cache directory when set;
    never the rest of the data home."""
    found: list[Path] = []
    if env.get("TRNF_HOME"):
        home = Path(env["TRNF_HOME"]).expanduser().resolve()
        found += [home / "datasets", home / "active", home / "data", home / "tokenizer"]
    if env.get(KIT_CACHE_DIR_ENV):
        found.append(Path(env[KIT_CACHE_DIR_ENV]).expanduser().resolve())
    return tuple(p for p in found if p.exists())


def dry_run_jail(work: Path, run_dir: Path, env: dict[str, str], prepare: Path | None,
                 writable: tuple[Path, ...] = ()) -> sandbox.Jail:
    """The sandbox of a dry run: its home (``work/home``) and ``run_dir`` writable (and ``writable``),
    the clean venv (``work/venv``), the data and prepare.py read-only. Nothing else under ``work``
    is visible, so what trnf keeps there (the venv it reads links from) the run cannot change."""
    extra = (prepare.resolve(),) if prepare is not None else ()
    venv = (work / "venv",) if (work / "venv").is_dir() else ()
    return sandbox.Jail(scratch=work / "home", env=env, read_only=(*venv, *data_paths(env), *extra),
                        writable=(run_dir, *writable), cwd=run_dir)


def logged_boundaries(run_dir: Path) -> tuple[tuple[Boundary, ...], str]:
    """((step, time) of each boundary the dry run's last process recorded, why there are
    none): the log absent, unsafe to read (a link, a FIFO, over ``STEP_LOG_CAP``), in a form
    trnf does not read, or holding no step, each said as that (never blamed on train.py when
    it did write a log). Only the steps are counted, so a log without a header line is read
    from time 0 (its times are not used)."""
    path = run_dir / STEP_LOG_FILE
    try:
        data = hostfs.read_capped(run_dir, STEP_LOG_FILE, STEP_LOG_CAP)
    except FileNotFoundError:
        return (), no_step_log(path)
    except (OSError, hostfs.UnsafeFile) as exc:
        return (), f"the step log could not be read: {exc}"
    # Parsed from trnf's own copy: the reader opens a path, and this one no sandbox can touch.
    with tempfile.TemporaryDirectory(prefix="trnf-steplog-") as tmp:
        copy = Path(tmp) / STEP_LOG_FILE
        copy.write_bytes(data)
        try:
            boundaries = read_step_log(copy, launch=0.0).last.boundaries
        except (OSError, StepLogError, ValueError, TypeError, OverflowError, RecursionError) as exc:
            return (), f"the step log could not be read: {unread_step_log(path, exc)}"
    return boundaries, "" if boundaries else f"the step log {path} records no step"


def load_back(run_dir: Path, checkpoint: Path, *, python: Path, env: dict[str, str], timeout: float,
              sandboxed: bool | None = None) -> tuple[bool, str]:
    """Load ``checkpoint`` through run_dir/train.py's load_for_eval with the model server, in the
    clean environment and the sandbox: (True, what the forward gave) or (False, why not)."""
    ok, detail, _ = load_and_list(run_dir, checkpoint, python=python, env=env, timeout=timeout, sandboxed=sandboxed)
    return ok, detail


def load_and_list(run_dir: Path, checkpoint: Path, *, python: Path, env: dict[str, str], timeout: float,
                  sandboxed: bool | None = None) -> tuple[bool, str, dict[str, Any]]:
    """``load_back``, plus the loaded model's tensor report (``ServedModel.tensors``; empty on failure)."""
    import torch

    del env  # the server gets its own minimal environment
    venv = Path(python).parent.parent
    trusted = venv_prepare(venv)
    confined = sandbox.available().ok if sandboxed is None else sandboxed
    # Sandboxed, the server's home is a private tmpfs; unsandboxed, a fresh directory beside the run.
    scratch = None if confined else Path(tempfile.mkdtemp(prefix="load-", dir=run_dir.parent))
    try:
        with ServedModel.start(root=run_dir, checkpoint=checkpoint, prepare=None, scratch=scratch, timeout=timeout,
                               sandboxed=confined, python=str(python), read_only=(venv, *trusted)) as served:
            logits = served.forward(torch.zeros(1, 8, dtype=torch.long))
            report = served.tensors()
    except ServerError as exc:
        return False, str(exc), {}
    finally:
        if scratch is not None:
            hostfs.remove_tree(scratch)
    if not bool(torch.isfinite(logits).all()):
        return False, f"forward gives {tuple(logits.shape)} with NaN or inf", report
    return True, f"forward gives {tuple(logits.shape)}", report


def venv_prepare(venv: Path) -> tuple[Path, ...]:
    """The trusted prepare.py a clean venv links to (bound read-only so the link resolves in the sandbox)."""
    found = [link.resolve() for link in venv.glob("lib/python*/site-packages/prepare.py")]
    return tuple(p for p in found if p.exists())


def confine(argv: list[str], *, work: Path, run_dir: Path, env: dict[str, str], prepare: Path | None,
            timeout: float) -> tuple[list[str], dict[str, str], str]:
    """``argv`` (a dry run's torchrun) wrapped in the dry-run sandbox, for a caller that starts it
    itself (the kit's launcher): (command, its environment, one line saying how it is confined).
    Without bubblewrap the command runs unconfined but scrubbed, and the line says so."""
    state = sandbox.available()
    logs_dir = work / "logs"  # the kit's launcher keeps torchrun's rank logs there
    logs_dir.mkdir(parents=True, exist_ok=True)
    (work / "home").mkdir(exist_ok=True)
    command = sandbox.wrap(argv, dry_run_jail(work, run_dir, env, prepare, writable=(logs_dir,)), sandbox.Limits(wall_seconds=timeout),
                           sandboxed=state.ok)
    if command.fds:  # a host scratch gives the sandbox its /etc as files, never through descriptors
        command.close_fds()
        raise RuntimeError("the dry-run jail needs no inherited descriptors")
    line = "sandboxed (bubblewrap: no network, read-only but its run and home dirs)" if state.ok else f"NOT sandboxed: {state.detail}"
    return command.argv, command.env, line
