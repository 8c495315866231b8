"""Hostile fields: numbers, types and text in an archive built to crash a parser or a terminal.

Each case is a small edit of the shared honest archive (``hostile.pack``); each must be a
refusal by its named check that names the field, never a traceback: 5,000-digit integers
(``int()`` refuses them with a ValueError), integers too large for ``float()``, ``1e999``
(parsed as infinity), a dtype given as a list, text that is not UTF-8, a claim typed wrong or
measured on one row, rich markup and terminal escapes quoted in a reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hostile import Case, Ctx, _runs, _safetensors, _with, pack
from verify_kit import TRAIN_PY, good_meta

from trnfrontier import submission as fmt

HUGE = "9" * 5000  # over Python's 4,300-digit int() limit
BIG = "1" + "0" * 400  # an int, but float() overflows


def _manifest_field(path: tuple[str, ...], raw: str) -> Callable[[Ctx], Path]:
    """The honest manifest with the JSON value at ``path`` replaced by the literal text ``raw``."""
    def build(ctx: Ctx) -> Path:
        built = fmt.build_manifest(_with({}), **good_meta())
        marker = "__FIELD__"
        target: Any = built
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = marker
        return pack(ctx, manifest=json.dumps(built, sort_keys=True).replace(json.dumps(marker), raw).encode())

    return build


def _claim(**values: Any) -> Callable[[Ctx], Path]:
    def build(ctx: Ctx) -> Path:
        meta = good_meta()
        meta["claimed"].update(values)
        return pack(ctx, meta=meta)

    return build


def _member(name: str, data: bytes) -> Callable[[Ctx], Path]:
    return lambda ctx: pack(ctx, _with({name: data}))


_HEADER_OK = '{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
_STEP_HEADER = b'{"header": true, "start_time": 1000.0, "pid": 1}\n'

FIELDS: dict[str, Case] = {
    "manifest-5000-digit-seed": Case(_manifest_field(("seed",), HUGE), "manifest", says="seed"),
    "manifest-5000-digit-params": Case(_manifest_field(("params",), HUGE), "manifest", says="params"),
    "manifest-1e999-size": Case(_manifest_field(("files", fmt.TRAIN_PY, "size"), "1e999"), "manifest", says="size"),
    "summary-5000-digit-charge": Case(_member(fmt.SUMMARY, f'{{"val_bpb": 12.0, "charged_seconds": {HUGE}}}'.encode()), "budget",
                                      says="charged_seconds"),
    "metrics-5000-digit": Case(_member(fmt.METRICS_LOG, f'{{"step": 1, "loss": {HUGE}}}\n'.encode()), "budget", says="loss"),
    "metrics-not-utf8": Case(_member(fmt.METRICS_LOG, b'{"step": 1, "loss": "\xff\xfe"}\n'), "budget", says="UTF-8"),
    "metrics-one-long-line": Case(_member(fmt.METRICS_LOG, b'{"x": "' + b"a" * (2 << 20) + b'"}\n'), "budget", says="characters long"),
    "step-log-huge-integer-time": Case(_member(fmt.STEP_LOG, _STEP_HEADER + f'{{"step": 0, "time": {BIG}}}\n'.encode()), "budget",
                                       says="time"),
    "step-log-5000-digit-step": Case(_member(fmt.STEP_LOG, _STEP_HEADER + f'{{"step": {HUGE}, "time": 1001.0}}\n'.encode()), "budget",
                                     says="step"),
    "step-log-line-flood": Case(_member(fmt.STEP_LOG, _STEP_HEADER + b"{}\n" * 1_000_001), "budget", says="1,000,002 lines"),
    "step-log-infinite-start": Case(_member(fmt.STEP_LOG, b'{"header": true, "start_time": 1e999, "pid": 1}\n'), "budget",
                                    says="start_time"),
    "safetensors-5000-digit-offset": Case(_member(fmt.CHECKPOINT_SAFETENSORS, _safetensors(
        ('{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, ' + HUGE + "]}}").encode(), bytes(4))), "checkpoint",
        says="data_offsets"),
    "safetensors-dtype-list": Case(_member(fmt.CHECKPOINT_SAFETENSORS, _safetensors(
        _HEADER_OK.replace('"F32"', '["F32"]').encode(), bytes(4))), "checkpoint", says="dtype"),
    "safetensors-shape-string": Case(_member(fmt.CHECKPOINT_SAFETENSORS, _safetensors(
        _HEADER_OK.replace("[1]", '"1"').encode(), bytes(4))), "checkpoint", says="shape"),
    "claim-400-digit-bpb": Case(_claim(val_bpb=int(BIG)), "manifest", says="claimed.val_bpb"),
    "claim-seq-len-float": Case(_claim(eval_seq_len=32.0), "rerun-eval", fake=True, says="claimed.eval_seq_len"),
    "claim-seq-len-string": Case(_claim(eval_seq_len="32"), "rerun-eval", fake=True, says="claimed.eval_seq_len"),
    "claim-tokens-bool": Case(_claim(eval_tokens=True), "rerun-eval", fake=True, says="claimed.eval_tokens"),
    "claim-one-row": Case(_claim(eval_tokens=32, val_bpb=0.5), "rerun-eval", fake=True, says="measured on 32 tokens"),
    "claim-other-split": Case(_claim(split="train"), "rerun-eval", fake=True, says="claimed.split"),
    "claim-negative-bpb": Case(_claim(val_bpb=-1.0), "rerun-eval", fake=True, says="claimed.val_bpb"),
    "screen-finding-with-markup-and-escapes": Case(
        lambda ctx: pack(ctx, _with({fmt.TRAIN_PY: (TRAIN_PY + '\nX = "public_val [/] [bold red]\\x1b]0;pwned\\x07\\x1b[2J"\n').encode()})),
        "screen", says="public_val"),
    "load-error-with-markup-and-escapes": _runs(at_load="raise RuntimeError('[/] [link=file:///etc/passwd]x[/link] \\x1b[2J\\u202e')"),
}
