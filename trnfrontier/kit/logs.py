"""What a kit-style train.py printed: step lines, totals, and the failing rank's last words.

A team's train.py prints whatever it likes. The usual step-line shapes are understood:

    step 12 | loss 3.2100 | lr 0.001 | 12,345 tok/s | mfu 30.1% | charged 123.4/1800 s
    step:12/100 train_loss:3.2100 train_time:1234ms step_avg:102.83ms
    step 00012/01000 (1.2%) | loss: 3.210000 | lrm: 1.00 | dt: 123.45ms | tok/sec: 12,345 | mfu: 30.00

A step line starts with the word ``step`` and a number; ``name value`` / ``name: value``
/ ``name=value`` pairs after it are read by name (``loss``/``train_loss``, ``lr``,
``tok/s``/``tok/sec``/``tokens/s`` (also ``12,345 tok/s``), ``mfu`` (a value above 1 is a
percentage), ``val_bpb``, ``val_loss``, ``tokens``). Whatever is not found is reported as
missing rather than guessed.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnfrontier.contract.steplog_lines import STEP_LINE, TEE_PREFIX

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)\b"
_PAIR = re.compile(rf"([A-Za-z_][\w/]*)\s*[:=]?\s*({_NUMBER})(\s*%)?", re.IGNORECASE)
_RATE_FIRST = re.compile(rf"({_NUMBER})\s*tok(?:en)?s?/s(?:ec)?\b", re.IGNORECASE)
_PARAMS = (
    re.compile(r"\b(?:num_params|n_params|params|parameters)\b\D{0,20}?(\d[\d,_]*(?:\.\d+)?)\s*([KMB])?\b", re.IGNORECASE),
    re.compile(r"(\d[\d,_]*(?:\.\d+)?)\s*([KMB])?\s+(?:params|parameters)\b", re.IGNORECASE),
)

_KEYS = {
    "loss": "loss", "train_loss": "loss", "train/loss": "loss",
    "lr": "lr", "learning_rate": "lr",
    "tok/s": "tokens_per_second", "tok/sec": "tokens_per_second", "tokens/s": "tokens_per_second",
    "tokens/sec": "tokens_per_second", "tokens_per_second": "tokens_per_second", "tps": "tokens_per_second",
    "mfu": "mfu", "val_bpb": "val_bpb", "val_loss": "val_loss", "tokens": "tokens",
}
_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def strip_prefix(line: str) -> str:
    return TEE_PREFIX.sub("", line, count=1)


def parse_step_line(line: str) -> dict[str, Any] | None:
    """The step record in one printed line, or None when the line is not a step line."""
    line = strip_prefix(line).strip()
    match = STEP_LINE.match(line)
    if match is None:
        return None
    record: dict[str, Any] = {"step": int(match.group(1))}
    rest = line[match.end():]
    for rate in _RATE_FIRST.finditer(rest):
        record.setdefault("tokens_per_second", _number(rate.group(1)))
    for key, value, percent in _PAIR.findall(rest):
        name = _KEYS.get(key.lower())
        if name is None or name in record:
            continue
        number = _number(value)
        if name == "mfu" and (percent or number > 1.0):
            number /= 100.0
        record[name] = int(number) if name == "tokens" and math.isfinite(number) else number
    return record


def parse_params(lines: Iterable[str]) -> int | None:
    """A parameter count the script printed ("Number of parameters: 59,604,992", "params 59.6M")."""
    for line in lines:
        if STEP_LINE.match(strip_prefix(line).strip()):
            continue
        match = _PARAMS[0].search(line) or _PARAMS[1].search(line)
        if match:
            return int(_number(match.group(1).replace("_", "")) * _SCALE.get((match.group(2) or "").upper(), 1))
    return None


@dataclass
class PrintedRun:
    """Everything read from rank 0's output."""

    records: list[dict[str, Any]] = field(default_factory=list)
    params: int | None = None
    # The kit's closing block: a line `---`, then `key: value` lines (public_val_bpb, ...).
    block: dict[str, Any] = field(default_factory=dict)

    def last(self, name: str) -> Any:
        for record in reversed(self.records):
            if name in record:
                return record[name]
        return None

    def non_finite_loss_step(self) -> int | None:
        """The first step whose printed loss is NaN or infinite."""
        for record in self.records:
            loss = record.get("loss")
            if isinstance(loss, float) and not math.isfinite(loss):
                return int(record["step"])
        return None


def read_printed(paths: Iterable[Path]) -> PrintedRun:
    lines: list[str] = []
    for path in paths:
        if path.is_file():
            lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
    records: list[dict[str, Any]] = []
    for record in (parse_step_line(line) for line in lines):
        if record is None:
            continue
        if records and records[-1]["step"] == record["step"]:
            # "step 8 | val_bpb ..." after "step 8 | loss ...": one step, one record.
            records[-1].update({k: v for k, v in record.items() if k not in records[-1]})
        else:
            records.append(record)
    return PrintedRun(records=records, params=parse_params(lines), block=parse_summary_block(lines))


def _value(text: str) -> Any:
    """A summary value as the kit prints it: a number, True/False, else the text."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text.replace(",", ""))
    except ValueError:
        pass
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def parse_summary_block(lines: Iterable[str]) -> dict[str, Any]:
    """The last `---` block rank 0 printed: ``key: value`` lines after a line ``---``
    (checkpoint_path, training_seconds, num_steps, public_val_bpb, eval_seconds, ...)."""
    block: dict[str, Any] | None = None
    for raw in lines:
        line = strip_prefix(raw).strip()
        if line == "---":
            block = {}
            continue
        if block is None:
            continue
        key, sep, value = line.partition(":")
        if sep and re.fullmatch(r"[A-Za-z_]\w*", key.strip()):
            block[key.strip()] = _value(value.strip())
    return block or {}


# ---------------------------------------------------------------------------- per-rank logs


@dataclass(frozen=True)
class RankLog:
    rank: int
    stdout: Path
    stderr: Path


def collect_rank_logs(torchrun_dir: Path, dest: Path) -> dict[int, RankLog]:
    """Move torchrun's ``<run id>/attempt_<n>/<local rank>/{stdout,stderr}.log`` to
    ``dest/rank<r>.{stdout,stderr}.log`` (flat names a person finds), last attempt winning."""
    logs: dict[int, RankLog] = {}
    dest.mkdir(parents=True, exist_ok=True)
    for rank_dir in sorted(torchrun_dir.glob("*/attempt_*/*"), key=lambda p: (p.parent.name, p.name)):
        if not rank_dir.name.isdigit():
            continue
        rank = int(rank_dir.name)
        moved = []
        for stream in ("stdout", "stderr"):
            target = dest / f"rank{rank}.{stream}.log"
            source = rank_dir / f"{stream}.log"
            if source.is_file():
                shutil.move(str(source), target)
            else:
                target.touch()
            moved.append(target)
        logs[rank] = RankLog(rank, moved[0], moved[1])
    shutil.rmtree(torchrun_dir, ignore_errors=True)
    return logs


_ROOT_CAUSE_RANK = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.DOTALL)


# What a rank prints when a *peer* died under it in a collective: a consequence, not a cause.
_COLLATERAL = (
    "Connection closed by peer",
    "Connection reset by peer",
    "DistBackendError",
    "DistNetworkError",
    "NCCL communicator was aborted",
)


def failing_rank(console: str, logs: dict[int, RankLog]) -> int | None:
    """The rank that failed first.

    A rank whose traceback is its own (not a collective broken by a dead peer) wins, the
    lowest if several; torchrun's "Root Cause" is next (it orders failures by when it
    *observed* them, so under load a rank killed by its peer's crash can come first); else
    the lowest rank with any traceback."""
    tracebacks = {}
    for rank in sorted(logs):
        text = logs[rank].stderr.read_text(errors="replace")
        if "Traceback (most recent call last)" in text:
            tracebacks[rank] = text
    own = [rank for rank, text in tracebacks.items() if not any(mark in text for mark in _COLLATERAL)]
    if own and len(own) < len(tracebacks):
        return own[0]
    match = _ROOT_CAUSE_RANK.search(console)
    if match:
        return int(match.group(1))
    return next(iter(tracebacks), None)


def failure(console: str, logs: dict[int, RankLog], console_log: Path) -> tuple[int | None, Path, list[str]]:
    """(failing rank, the log that shows why, its last lines): the failing rank's stderr (with
    its stdout's last lines when stderr is empty), else torchrun's console log."""
    rank = failing_rank(console, logs)
    if rank is None or rank not in logs:
        return rank, console_log, tail(console_log)
    return rank, logs[rank].stderr, tail(logs[rank].stderr) or tail(logs[rank].stdout)


def tail(path: Path, lines: int = 12) -> list[str]:
    """The last non-empty lines of a log file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def shorten(text: str, limit: int = 1000) -> str:
    """``text`` whole, or, beyond ``limit`` characters, cut at a word with an ellipsis: a
    message quoting a script's error is one readable line, never cut mid-word."""
    if len(text) <= limit:
        return text
    return text[: limit - 1].rsplit(" ", 1)[0] + " …"


def last_error_line(lines: list[str]) -> str:
    """The line that names the exception (``ValueError: ...``), else the last line."""
    bare = [strip_prefix(line).strip() for line in lines]
    for line in reversed(bare):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", line):
            return line
    return bare[-1] if bare else ""


# ---------------------------------------------------------------------------- an abort at exit

# torch's gloo backend frees a collective's tensors on its own worker thread just after the
# collective completes, and freeing a tensor Python made needs the GIL. When the script has
# already ended and the interpreter is shutting down, that thread cannot take the GIL: Python
# ends it, the unwinding meets a noexcept destructor, and the C++ runtime aborts the process
# (exit -6) after the script's last line ran. A script whose last collective is an
# all-reduce shortly before it exits (the kit's evaluate_bpb) hits this now and then
# (torch 2.13 on CPU: 1 run in ~12 on a loaded 2-core machine); torchrun then stops the
# other ranks and exits 1. trnf starts every rank with faulthandler on (child_env), so the
# abort prints each Python thread's stack: all of them empty means no Python code was
# running any more, which tells this apart from a crash.
ABORT_WITHOUT_EXCEPTION = "terminate called without an active exception"
_FATAL = "Fatal Python error:"
_FATAL_ABORT = f"{_FATAL} Aborted"
_THREAD_HEADER = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):$")
_NO_FRAME = "<no Python frame>"
_TRACEBACK = "Traceback (most recent call last):"


def aborted_after_finishing(text: str) -> bool:
    """Whether ``text`` (a rank's stderr, or a console holding it) ends with a process that
    aborted in interpreter shutdown, after its script had finished: the C++ runtime's
    "terminate called without an active exception", then faulthandler's dump with no
    Python frame in any thread. False for any other failure, without faulthandler's dump, or
    after a Python traceback (a script that raised also ends in interpreter shutdown)."""
    lines = [strip_prefix(line).strip() for line in text.splitlines()]
    if _TRACEBACK in lines:
        return False
    fatal = [i for i, line in enumerate(lines) if line == _FATAL_ABORT]
    if not fatal or ABORT_WITHOUT_EXCEPTION not in lines[max(0, fatal[-1] - 3):fatal[-1]]:
        return False
    return _dump_shows_no_python_frame([line for line in lines[fatal[-1] + 1:] if line])


def _dump_shows_no_python_frame(dump: list[str]) -> bool:
    """faulthandler's thread dump (the lines after its "Fatal Python error") lists threads,
    each followed by ``<no Python frame>``, up to "Extension modules:". In shutdown it can
    crash itself reading a thread being torn down ("Thread 0xFatal Python error:
    Segmentation fault"): the dump ends there, and what it showed until then counts."""
    threads = 0
    for i, line in enumerate(dump):
        if _FATAL in line:
            return True  # the dump was cut short before it showed any Python frame
        if line.startswith("Extension modules:"):
            break
        if _THREAD_HEADER.match(line):
            threads += 1
            shown = dump[i + 1] if i + 1 < len(dump) else ""
            if shown != _NO_FRAME and _FATAL not in shown:
                return False
    return threads > 0


def rank_aborted_after_finishing(console: str, logs: dict[int, RankLog]) -> int | None:
    """The failing rank (``failing_rank``) when its own stderr shows an abort in interpreter
    shutdown after its script finished (``aborted_after_finishing``); None otherwise."""
    rank = failing_rank(console, logs)
    if rank is None or rank not in logs:
        return None
    return rank if aborted_after_finishing(logs[rank].stderr.read_text(errors="replace")) else None
