"""How trnf calls a trusted prepare.py: only the organisers' names, the way their train.py calls them.

Every call trnf makes into a prepare.py (its own, or the organisers' copy) goes through
this module. It knows the surface in ``docs/kit-contract.md`` and nothing more:

- functions are called **positionally where the kit's train.py is positional**
  (``causality_check(model, tokenizer, batch_size, seq_len, device)``,
  ``evaluate_bpb(model, tokenizer, batch_size, seq_len, device, split=..., max_tokens=...,
  timeout_seconds=...)``, ``make_dataloader(tokenizer, batch_size, seq_len, split, device)``);
- a keyword is passed only when the function's signature accepts it
  (``inspect.signature``); what was left out is reported, never silently assumed;
- constants beyond the contract (``EVAL_SEQ_LEN``, ``EVAL_TOKENS_PUBLIC``, ...) are read
  with the contract's implied defaults (``CONTRACT_DEFAULTS``), never required;
- when prepare.py's own code raises (or its signature refuses the call), the error is
  ``PrepareRejected``: "prepare.py (PATH) rejected the call: ...". A failure inside the
  model's code stays the caller's to report as the model's.

Standard library only, no trnfrontier import: the runtime (what a submission carries)
uses it, and a sandboxed probe may load this file by path (``load_by_path``).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import sysconfig
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

# The names docs/kit-contract.md evidences; a prepare.py with exactly these is enough for trnf.
CONTRACT_CONSTANTS = (
    "TRAIN_TIME_BUDGET_SECONDS",
    "TRAIN_STARTUP_STEPS_EXCLUDED",
    "TRAIN_STARTUP_ALLOWANCE_CAP_SECONDS",
    "EVAL_TIMEOUT_SECONDS",
    "TOKENIZER_VOCAB_SIZE",
)
CONTRACT_FUNCTIONS = (
    "Tokenizer",
    "ensure_tokenizer",
    "get_token_bytes",
    "get_dist_info",
    "print0",
    "make_dataloader",
    "_document_batches",
    "_row_groups_for_split",
    "record_step_boundary",
    "causality_check",
    "evaluate_bpb",
)
CONTRACT_NAMES = CONTRACT_CONSTANTS + CONTRACT_FUNCTIONS

# Values the contract states or implies, used when a prepare.py does not define the name.
# EVAL_SEQ_LEN: the kit's evaluations run at its training context (1024 in the evidenced
# logs); EVAL_TOKENS_*: the kit's _EVAL_TOKENS default (4 x 524,288) and the 10x official run.
CONTRACT_DEFAULTS: dict[str, Any] = {
    "TRAIN_TIME_BUDGET_SECONDS": 1800,
    "TRAIN_STARTUP_STEPS_EXCLUDED": 5,
    "TRAIN_STARTUP_ALLOWANCE_CAP_SECONDS": 900,
    "EVAL_TIMEOUT_SECONDS": 1200,
    "TOKENIZER_VOCAB_SIZE": 8192,
    "EVAL_SEQ_LEN": 1024,
    "EVAL_TOKENS_PUBLIC": 2_097_152,
    "EVAL_TOKENS_OFFICIAL": 20_971_520,
    "EVAL_BATCH_SIZE": 8,
}
# The seven keys of the kit's evaluate_bpb result.
EVAL_RESULT_KEYS = ("val_bpb", "total_nats", "num_tokens", "num_bytes", "eval_seconds", "eval_timeout", "eval_over_timeout")


class PrepareRejected(Exception):
    """prepare.py's own function refused a call (its signature, or an error raised in its code)."""

    def __init__(self, path: str, call: str, detail: str) -> None:
        super().__init__(f"prepare.py ({path}) rejected the call {call}: {detail}")
        self.path, self.call, self.detail = path, call, detail


class MissingName(PrepareRejected):
    """prepare.py lacks a name of the contract that this call needs."""


def prepare_path(prepare: ModuleType) -> str:
    return str(getattr(prepare, "__file__", None) or getattr(prepare, "__name__", "prepare"))


def constant(prepare: ModuleType | None, name: str) -> Any:
    """``prepare.NAME``, else the contract's default (never a KeyError for a missing extra)."""
    if hasattr(prepare, name):
        return getattr(prepare, name)
    return CONTRACT_DEFAULTS[name]


def accepted(function: Any, names: list[str] | tuple[str, ...]) -> set[str]:
    """Which of ``names`` the function takes as keywords (all of them behind a ``**kwargs``)."""
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass nothing optional
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return set(names)
    usable = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n for n in names if n in params and params[n].kind in usable}


def _short(value: Any) -> str:
    if isinstance(value, (int, float, str, bool)) or value is None:
        return repr(value)
    return type(value).__name__


def _describe(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


# trnf's own package: its files are model code (the runtime GPT), wherever it is installed.
_TRNF_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep


def _is_library(filename: str) -> bool:
    """torch, numpy, the standard library: code that runs on behalf of its caller."""
    if filename.startswith("<"):
        return True
    real = os.path.realpath(filename)
    if real.startswith(_TRNF_PACKAGE):
        return False
    if any(f"{os.sep}{d}{os.sep}" in real for d in ("site-packages", "dist-packages")):
        return True
    paths = sysconfig.get_paths()
    stdlib = {os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if paths.get(k)}
    return any(real.startswith(d) for d in stdlib)


def raised_in_prepare(exc: BaseException, prepare: ModuleType) -> bool:
    """True when the error comes from prepare.py's code (or libraries it called), False when
    any frame below the call is someone else's code (the model's forward, train.py)."""
    own = {os.path.realpath(prepare_path(prepare)), prepare_path(prepare)}
    frames = traceback.extract_tb(exc.__traceback__)
    inside = False
    for frame in frames:
        filename = frame.filename
        if filename in own or os.path.realpath(filename) in own:
            inside = True
            continue
        if not inside:
            continue  # the caller's frames, above the call into prepare.py
        if _is_library(filename) or os.path.realpath(filename) == os.path.realpath(__file__):
            continue  # torch, numpy, the stdlib: running on prepare.py's behalf
        return False
    return inside


def call(prepare: ModuleType, name: str, *args: Any, optional: dict[str, Any] | None = None) -> Any:
    """``prepare.NAME(*args, **accepted optional keywords)``.

    The positional arguments are the contract's; ``optional`` keywords are passed only
    when the signature takes them. A refusal by the signature, or an exception raised in
    prepare.py's own code, becomes PrepareRejected; an exception from other code under the
    call (the model) propagates unchanged."""
    function = getattr(prepare, name, None)
    if not callable(function):
        raise MissingName(prepare_path(prepare), f"{name}()", f"it defines no {name}")
    kwargs = {k: v for k, v in (optional or {}).items() if k in accepted(function, tuple(optional or {}))}
    described = _describe(name, args, kwargs)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PrepareRejected(prepare_path(prepare), described, f"its signature {name}{signature} refuses it ({exc})") from None
    try:
        return function(*args, **kwargs)
    except Exception as exc:
        if raised_in_prepare(exc, prepare):
            raise PrepareRejected(prepare_path(prepare), described, f"{type(exc).__name__}: {exc}") from exc
        raise


# ------------------------------------------------------------------ the contract's calls


def ensure_tokenizer(prepare: ModuleType) -> Any:
    return call(prepare, "ensure_tokenizer")


def causality_check(prepare: ModuleType, model: Any, tokenizer: Any, batch_size: int, seq_len: int, device: Any) -> dict[str, Any]:
    """The kit's call, positional: ``{"passed": bool, "max_abs_diff": float}``."""
    result = call(prepare, "causality_check", model, tokenizer, int(batch_size), int(seq_len), device)
    try:
        return {"passed": bool(result["passed"]), "max_abs_diff": float(result["max_abs_diff"])}
    except (TypeError, KeyError, ValueError):
        raise PrepareRejected(prepare_path(prepare), "causality_check(...)",
                              f"it returned {result!r}, not {{'passed': bool, 'max_abs_diff': float}}") from None


def evaluate_bpb(
    prepare: ModuleType,
    model: Any,
    tokenizer: Any,
    batch_size: int,
    seq_len: int,
    device: Any,
    *,
    split: str | None = None,
    max_tokens: int | None = None,
    timeout_seconds: float | None = None,
) -> dict[str, Any]:
    """The kit's call: five positional arguments, then the evidenced keywords (split,
    max_tokens, timeout_seconds) when given and accepted.

    The result is prepare.py's dict as it returned it (plus ``dropped_keywords`` when a
    keyword had to be left out, so a caller can say the request was not honoured)."""
    # No split literal here: this file ships in submissions, and the static screen refuses
    # naming the validation split outside a call to evaluate_bpb. None: prepare.py's default.
    optional: dict[str, Any] = {} if split is None else {"split": split}
    if max_tokens is not None:
        optional["max_tokens"] = int(max_tokens)
    if timeout_seconds is not None:
        optional["timeout_seconds"] = timeout_seconds
    function = getattr(prepare, "evaluate_bpb", None)
    dropped = sorted(set(optional) - accepted(function, tuple(optional))) if callable(function) else []
    result = call(prepare, "evaluate_bpb", model, tokenizer, int(batch_size), int(seq_len), device, optional=optional)
    if not isinstance(result, dict) or "val_bpb" not in result:
        raise PrepareRejected(prepare_path(prepare), "evaluate_bpb(...)", f"it returned {type(result).__name__} without val_bpb")
    result = dict(result)
    if dropped:
        result["dropped_keywords"] = dropped
    return result


def make_dataloader(
    prepare: ModuleType, tokenizer: Any, batch_size: int, seq_len: int, split: str, device: Any,
    **extras: Any,
) -> Iterator[Any]:
    """The kit's call, positional; ``extras`` (resume_state, rank, world_size: this project's
    additions) only when the signature takes them. Which extras were honoured: ``accepted``."""
    extras = {k: v for k, v in extras.items() if v is not None}
    return call(prepare, "make_dataloader", tokenizer, int(batch_size), int(seq_len), split, device, optional=extras)


def record_step_boundary(prepare: ModuleType, step: int) -> None:
    """``record_step_boundary(step)`` with the 0-based index of the step just completed."""
    call(prepare, "record_step_boundary", int(step))


# ------------------------------------------------------------------ surface checks


def missing_names(prepare: ModuleType, names: tuple[str, ...] = CONTRACT_NAMES) -> list[str]:
    """The contract names a prepare.py lacks (what a kit train.py would fail to import)."""
    return [n for n in names if not hasattr(prepare, n)]


def load_by_path(path: str | os.PathLike[str]) -> ModuleType:
    """Load this adapter from a file path (a sandbox where trnfrontier is not installed)."""
    spec = importlib.util.spec_from_file_location("trnf_prepare_calls", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module
