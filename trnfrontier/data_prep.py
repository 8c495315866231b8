"""The library behind `trnf prepare`: drive the trusted prepare.py's setup with rich progress.

The data work itself lives in the selected prepare.py (the project's, or the organisers'
with ``trnf --prepare PATH``); this module only shows progress, maps its errors to
``TrnfError`` and records which prepare.py did the work.
"""

from __future__ import annotations

import errno
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from trnfrontier import processes
from trnfrontier.console import err
from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.trusted_prepare import TrustedContract, load_contract

STAGE_LABELS = {"download": "downloading shards", "tokenizer": "training tokenizer", "tokenize": "tokenizing"}

ProgressCallback = Callable[[str, int, "int | None", str], None]


@contextmanager
def rich_progress(enabled: bool = True) -> Iterator[ProgressCallback]:
    """A ``progress(stage, done, total, unit)`` callback drawing one rich bar per stage on stderr."""
    if not enabled:
        yield lambda stage, done, total, unit: None
        return
    bars = Progress(
        TextColumn("{task.description:<20}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=err(),
        transient=False,
    )
    tasks: dict[str, Any] = {}

    def update(stage: str, done: int, total: int | None, unit: str) -> None:
        if not tasks:
            bars.start()  # on the first report: an early error or a reused dataset draws nothing
        if stage not in tasks:
            tasks[stage] = bars.add_task(STAGE_LABELS.get(stage, stage), total=total)
        bars.update(tasks[stage], completed=done, total=total)

    try:
        yield update
    finally:
        if tasks:
            bars.stop()


def run_prepare(
    source: str = "climbmix",
    path: str | None = None,
    num_train_shards: int | None = None,
    *,
    show_progress: bool = True,
    val_path: str | None = None,
    documents: str | None = None,
    tokenizer: str | None = None,
    build_tokenizer_if_missing: bool = False,
) -> dict[str, Any]:
    """Prepare a dataset with the selected trusted prepare.py; returns its summary plus
    ``prepare_path`` and ``prepare_sha256``. ``val_path`` and ``documents`` (local
    sources) keep a user's own validation split and documents; ``tokenizer`` chooses the
    shipped or a trained tokenizer and ``build_tokenizer_if_missing`` trains one when the
    shipped artifact is unusable (prepare.setup's arguments of the same names)."""
    contract = load_contract()
    check_choices(contract, source, path, num_train_shards)
    if source != "local" and (val_path is not None or documents is not None):
        raise UsageError(f"--val-path and --documents apply to --source local, not --source {source}")
    tokenizers = getattr(contract.module, "TOKENIZER_CHOICES", None)
    if tokenizer is not None and tokenizers is not None and tokenizer not in tokenizers:
        raise UsageError(f"--tokenizer {tokenizer}: unknown; choose one of {', '.join(tokenizers)}")
    setup = getattr(contract.module, "setup", None)
    if not callable(setup):
        if tokenizer is not None:
            raise TrnfError(f"{contract.path} has no setup() function, so --tokenizer cannot be used with it")
        summary = _run_setup_cli(contract, source, path, num_train_shards, build_tokenizer_if_missing)
    else:
        extra = {"val_path": val_path, "documents": documents, "tokenizer": tokenizer,
                 "build_tokenizer_if_missing": True if build_tokenizer_if_missing else None}
        kwargs = _setup_arguments(contract, setup, source, path, num_train_shards, extra)
        prepare_error = getattr(contract.module, "PrepareError", None)
        try:
            with rich_progress(show_progress) as progress:
                if "progress" in _parameters(setup):
                    kwargs["progress"] = progress
                summary = setup(**kwargs)
        except Exception as exc:
            if prepare_error is not None and isinstance(exc, prepare_error):
                raise TrnfError(str(exc)) from None
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise TrnfError(f"disk full ({exc.filename or 'data directory'}); free space and rerun `trnf prepare`") from None
            if isinstance(exc, OSError):
                where = exc.filename or "the data directory"
                raise TrnfError(
                    f"cannot write the data under {where} ({exc.strerror or exc}); "
                    "point --home / TRNF_HOME at a writable directory"
                ) from None
            raise
    summary = dict(summary)
    summary["prepare_path"] = str(contract.path)
    summary["prepare_sha256"] = contract.sha256
    return summary


def _parameters(function: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # a builtin or C function: assume the documented ones
        return {"source", "path", "num_train_shards", "progress"}


def _setup_arguments(contract: TrustedContract, setup: Callable[..., Any], source: str, path: str | None,
                     num_train_shards: int | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Only the arguments this prepare.py's setup() accepts; a choice it cannot honour is an error."""
    accepted = _parameters(setup)
    wanted = {"source": source if source != "climbmix" else None, "path": path, "num_train_shards": num_train_shards,
              **(extra or {})}
    kwargs: dict[str, Any] = {}
    for name, value in wanted.items():
        if value is None:
            continue
        if name not in accepted:
            raise TrnfError(f"{contract.path}: its setup() takes no {name!r}, so --{name.replace('_', '-')} cannot be used with it")
        kwargs[name] = value
    return kwargs


def check_choices(contract: TrustedContract, source: str, path: str | None, num_train_shards: int | None) -> None:
    """Command-line choices that contradict each other or the contract: usage errors (exit 2),
    refused before any data is touched."""
    sources = getattr(contract.module, "SOURCES", None)
    if sources is not None and source not in sources:
        raise UsageError(f"--source {source}: unknown source; choose one of {', '.join(sources)}")
    if source == "local" and path is None:
        raise UsageError("--source local needs --path DIR (a folder of .parquet, .jsonl or .txt files)")
    if source != "local" and path is not None:
        raise UsageError(f"--path applies to --source local; --source {source} reads no folder (add --source local)")
    if num_train_shards is not None:
        if source != "climbmix":
            raise UsageError(f"--num-train-shards applies to --source climbmix, not --source {source}")
        if num_train_shards < 1:
            raise UsageError(f"--num-train-shards {num_train_shards}: must be at least 1")


def _run_setup_cli(contract: TrustedContract, source: str, path: str | None, num_train_shards: int | None,
                   build_tokenizer_if_missing: bool = False) -> dict[str, Any]:
    """A prepare.py without a setup() function (the organisers' kit): run its command line."""
    if source != "climbmix" or path is not None:
        raise TrnfError(
            f"{contract.path} has no setup() function, so only its own `setup` command (climbmix) can run; "
            "drop --source/--path or use the project's prepare.py"
        )
    command = [sys.executable, str(contract.path), "setup"]
    if num_train_shards is not None:
        command += ["--num-train-shards", str(num_train_shards)]
    if build_tokenizer_if_missing:
        command.append("--build-tokenizer-if-missing")
    completed = processes.run_tree(command, stdout=sys.stderr)
    if completed.returncode != 0:
        raise TrnfError(f"`{' '.join(command)}` failed with exit code {completed.returncode}; see its output above")
    return {"source": source}
