"""The archive's model, served from inside the sandbox: load_for_eval, then logits on request.

Run as a script (``python -I modelserver.py ...``) inside bubblewrap, alone (it imports no
sibling); the tool imports it only for ``tensor_digest``, the digest both sides must compute
alike (nothing runs at import). It must work with the standard library, torch and the trusted prepare.py only.
It is the one process where train.py runs; everything that judges the model (causality,
batch independence, the trusted ``evaluate_bpb``) runs in verify's own process and sees
only the logits this server returns, so nothing train.py does here can reach the scorer.
The sandbox has no dataset bound: a model cannot read the validation split at load time.

Wire format on two inherited file descriptors (``--fd-in``, ``--fd-out``); every message
is ``uint32 little-endian header length, JSON header, payload of header["nbytes"] bytes``:

  server -> verify  {"ready": true, "prepare_changed": [...], "hooks": [...], "training": [...]}
                    or {"error": "..."} when train.py or load_for_eval fails
  verify -> server  {"op": "forward", "shape": [B, T]} + B*T int64 tokens
  server -> verify  {"shape": [B, T, V], "nbytes": n} + float32 logits, or {"error": "..."}
  verify -> server  {"op": "inspect"}  ->  {"hooks": [...], "training": [...], "attempts": [...], "filled": [...]}
  verify -> server  {"op": "tensors"}  ->  {} + a JSON payload: every tensor reachable from the
                    loaded model (parameters, buffers, attributes, archive modules' globals) with
                    its name, kind, dtype, shape and SHA256 (``verify.identity`` compares them with
                    the checkpoint verify checked)

The functions that build those reports are bound before train.py is imported, so a train.py
that replaces ``hashlib.sha256`` or ``Module.named_parameters`` does not change them.

With ``--inference-py`` (Phase 2) the server loads the model through the archive's
inference.py instead (``load_model``; the interface trnf infers, ``contract/inference.py``)
and answers, besides ``inspect``:

  verify -> server  {"op": "logprobs", "shape": [B, T]} + B*T int64 tokens
  server -> verify  {"shape": [B, T, V]} + float32 log-probabilities (next_token_logprobs)
  verify -> server  {"op": "logprobs_after", "shapes": [[G, P], [R, S], [R]]} + prefix, rows, owner (int64)
  server -> verify  {"shape": [R, S, V]} + float32 (next_token_logprobs_after, or the whole rows)
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import os
import struct
import sys
import traceback
import types

_MAX_HEADER = 1 << 16
# What train.py tried that the sandbox blocks or contains (writes outside its scratch,
# sockets, processes), seen by an audit hook installed before train.py is imported.
# The sandbox is the boundary; this only lets verify reject an archive whose attempt failed quietly.
_ATTEMPTS: list[str] = []
_PROCESS_EVENTS = frozenset({"os.system", "subprocess.Popen", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn"})
_PATH_EVENTS = frozenset({"os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.symlink", "os.link", "os.truncate", "shutil.rmtree"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _outside(path, allowed: tuple[str, ...]) -> str | None:
    try:
        resolved = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None  # a file descriptor, not a path
    return None if resolved == "/dev/null" or resolved.startswith(allowed) else resolved


def _watch(allowed: tuple[str, ...]):
    def hook(event: str, args: tuple) -> None:
        if len(_ATTEMPTS) >= 20:
            return
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writing = (isinstance(mode, str) and bool(set(mode) & set("wax+"))) or (isinstance(flags, int) and flags & _WRITE_FLAGS)
            where = _outside(path, allowed) if writing and path is not None else None
            if where:
                _ATTEMPTS.append(f"write to {where}")
        elif event in _PATH_EVENTS and args:
            where = _outside(args[0], allowed)
            if where:
                _ATTEMPTS.append(f"{event} {where}")
        elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
            _ATTEMPTS.append(f"{event} {args[1]!r}"[:120] if len(args) > 1 else event)
        elif event in _PROCESS_EVENTS:
            _ATTEMPTS.append(event)

    return hook


def _send(fd: int, header: dict, payload: bytes = b"") -> None:
    header = dict(header, nbytes=len(payload))
    raw = json.dumps(header).encode()
    data = struct.pack("<I", len(raw)) + raw + payload
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        block = os.read(fd, min(left, 1 << 22))
        if not block:
            raise EOFError("verify closed the channel")
        chunks.append(block)
        left -= len(block)
    return b"".join(chunks)


def _receive(fd: int) -> tuple[dict, bytes]:
    (size,) = struct.unpack("<I", _read_exact(fd, 4))
    if size > _MAX_HEADER:
        raise ValueError("header too long")
    header = json.loads(_read_exact(fd, size))
    return header, _read_exact(fd, int(header.get("nbytes", 0)))


def _public(module) -> dict:
    """Identity of every public attribute of ``module`` (and of each function's code and defaults)."""
    seen = {}
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        seen[name] = (id(value), id(getattr(value, "__code__", None)), id(getattr(value, "__defaults__", None)))
    return seen


def _changed(before: dict, module) -> list[str]:
    after = _public(module)
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))


def _load_prepare(path: str | None):
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("prepare", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["prepare"] = module  # `import prepare` in train.py gets the trusted file
    spec.loader.exec_module(module)
    return module


def _inspect(model) -> dict:
    from torch.nn.modules import module as nn_module

    hooks = []
    for name, sub in model.named_modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if getattr(sub, attr, None):
                hooks.append(f"{attr.strip('_')} on {name or 'the model'}")
    for attr in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks", "_global_backward_pre_hooks"):
        if getattr(nn_module, attr, None):
            hooks.append(f"a global {attr.strip('_')[7:]}")
    training = [n or "the model" for n, m in model.named_modules() if m.training]
    return {"hooks": hooks, "training": training[:5], "attempts": list(_ATTEMPTS), "filled": _filled()}


_SHA256 = hashlib.sha256
_REFERENTS = gc.get_referents
_MAX_OBJECTS = 500_000


def tensor_digest(tensor) -> str:
    """SHA256 of a tensor's bytes (16-bit floats, bools and float8 as their raw bits): what the
    server reports and what ``verify.identity`` computes for the checkpoint, so one definition."""
    import torch

    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    if flat.dtype in (torch.bfloat16, torch.float16):
        flat = flat.view(torch.int16)
    elif flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    elif str(flat.dtype).startswith("torch.float8"):
        flat = flat.view(torch.uint8)
    return _SHA256(flat.numpy().tobytes()).hexdigest()


def _entry(name: str, kind: str, tensor) -> dict:
    return {"name": name, "kind": kind, "dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape),
            "sha256": tensor_digest(tensor)}


def _registered(model) -> tuple[list[dict], set[int]]:
    """Every parameter and buffer of the module tree, walked through nn.Module's own registries
    (the base class's methods, whatever the archive's classes override)."""
    import torch

    entries, seen = [], set()
    for prefix, module in torch.nn.Module.named_modules(model, remove_duplicate=False):
        dot = prefix + "." if prefix else ""
        for name, param in (vars(module).get("_parameters") or {}).items():
            if param is not None:
                entries.append(_entry(dot + name, "parameter", param))
                seen.add(id(param))
        transient = vars(module).get("_non_persistent_buffers_set") or set()
        for name, buf in (vars(module).get("_buffers") or {}).items():
            if buf is not None:
                entries.append(_entry(dot + name, "buffer" if name not in transient else "transient buffer", buf))
                seen.add(id(buf))
    return entries, seen


def _archive_module(value, root: str) -> bool:
    return isinstance(value, types.ModuleType) and str(getattr(value, "__file__", "") or "").startswith(root)


def _reachable_tensors(model, root: str, seen: set) -> list[dict]:
    """Tensors reachable from the model object or the archive's modules that are no parameter or
    buffer: attribute caches, module globals, closures. Other modules (torch, numpy, prepare) are
    not entered; the walk is bounded."""
    import numpy as np
    import torch

    todo = [model, *(m for m in list(sys.modules.values()) if _archive_module(m, root))]
    visited: set = set()
    found: list[dict] = []
    while todo and len(visited) < _MAX_OBJECTS:
        obj = todo.pop()
        if id(obj) in visited:
            continue
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen:
                seen.add(id(obj))
                found.append(_entry(f"<unregistered #{len(found)}>", "unregistered", obj))
            continue
        if isinstance(obj, np.ndarray) and obj.size:
            found.append(_entry(f"<array #{len(found)}>", "unregistered", torch.from_numpy(np.ascontiguousarray(obj).view(np.uint8))))
            continue
        if isinstance(obj, types.ModuleType) and not _archive_module(obj, root):
            continue
        if isinstance(obj, type) and not str(getattr(sys.modules.get(obj.__module__), "__file__", "") or "").startswith(root):
            continue
        todo.extend(_REFERENTS(obj))
    return found


def _tensor_report(model, root: str) -> dict:
    entries, seen = _registered(model)
    return {"tensors": entries + _reachable_tensors(model, root, seen)}


def _filled() -> list[str]:
    """The sandbox's own filesystems that are (nearly) full: a limit train.py ran into."""
    full = []
    for path in (os.environ.get("HOME", ""), "/tmp", "/dev/shm"):
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        if st.f_blocks and st.f_bavail * 50 < st.f_blocks:  # under 2% left
            full.append(f"{path} ({st.f_blocks * st.f_frsize >> 20} MiB)")
    return full


def _logits(model, idx):
    out = model(idx)
    if isinstance(out, dict):
        out = out.get("logits")
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out


def _import_beside(name, path):
    """The archive's ``path`` imported as module ``name``, with its folder first on sys.path
    (so it imports its siblings, as train.py and inference.py do under the scorer)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _load(args):
    import torch

    prepare = _load_prepare(args.prepare)
    before = _public(prepare) if prepare is not None else {}
    sys.addaudithook(_watch(_scratch_dirs()))
    if args.inference_py:
        module = _import_beside("inference", args.inference_py)
        for name in ("load_model", "next_token_logprobs"):
            if not callable(getattr(module, name, None)):
                raise AttributeError(f"inference.py does not define {name}")
        model = _Inference(module, module.load_model(args.checkpoint, torch.device("cpu")))
    else:
        model = _import_beside("train", args.train_py).load_for_eval(args.checkpoint, torch.device("cpu"))
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"load_for_eval returned {type(model).__name__}, not an nn.Module")
    changed = _changed(before, prepare) if prepare is not None else []
    return model, changed


def _scratch_dirs() -> tuple:
    """Its own scratch (HOME, TMPDIR) only: /tmp is a throwaway tmpfs, but nothing honest needs it."""
    return tuple(os.path.abspath(p) + os.sep for p in (os.environ.get("HOME", "/nonexistent"), os.environ.get("TMPDIR", "/nonexistent"), "/dev/shm"))


class _Inference:
    """A model loaded through inference.py, and the module whose functions score with it."""

    def __init__(self, module, model) -> None:
        self.module, self.model = module, model

    def answer(self, header: dict, payload: bytes):
        import torch

        flat = torch.frombuffer(bytearray(payload), dtype=torch.int64)
        with torch.no_grad():
            if header.get("op") == "logprobs":
                batch, length = (int(v) for v in header["shape"])
                return self.module.next_token_logprobs(self.model, flat.reshape(batch, length))
            (g, p), (r, s), (r2,) = header["shapes"]
            prefix, rows, owner = flat.split([g * p, r * s, r2])
            prefix, rows = prefix.reshape(g, p), rows.reshape(r, s)
            after = getattr(self.module, "next_token_logprobs_after", None)
            if callable(after):
                return after(self.model, prefix, rows, owner)
            whole = torch.cat((prefix.index_select(0, owner), rows), dim=1) if p else rows
            return self.module.next_token_logprobs(self.model, whole)[:, p:]


def _inspect_loaded(loaded) -> dict:
    """``_inspect`` of what was loaded: load_for_eval's module, or the model inference.py's
    load_model returned (which need not be an nn.Module: then only what train.py tried)."""
    import torch

    model = loaded.model if isinstance(loaded, _Inference) else loaded
    if isinstance(model, torch.nn.Module):
        return _inspect(model)
    return {"hooks": [], "training": [], "attempts": list(_ATTEMPTS), "filled": _filled()}


def _serve_inference(served: _Inference, fd_in: int, fd_out: int) -> None:
    import torch

    while True:
        header, payload = _receive(fd_in)
        if header.get("op") == "inspect":
            _send(fd_out, _inspect_loaded(served))
            continue
        if header.get("op") not in ("logprobs", "logprobs_after"):
            return
        out = served.answer(header, payload)
        if not isinstance(out, torch.Tensor):
            _send(fd_out, {"error": f"inference.py returned {type(out).__name__}, not a tensor"})
            return
        out = out.detach().to("cpu", torch.float32).contiguous()
        _send(fd_out, {"shape": list(out.shape), "shares_prefixes": callable(getattr(served.module, "next_token_logprobs_after", None))}, out.numpy().tobytes())


def _serve(model, fd_in: int, fd_out: int, root: str) -> None:
    import torch

    if isinstance(model, _Inference):
        return _serve_inference(model, fd_in, fd_out)
    while True:
        header, payload = _receive(fd_in)
        if header.get("op") == "inspect":
            _send(fd_out, _inspect(model))
            continue
        if header.get("op") == "tensors":
            _send(fd_out, {}, json.dumps(_tensor_report(model, root)).encode())
            continue
        if header.get("op") != "forward":
            return
        batch, length = (int(v) for v in header["shape"])
        idx = torch.frombuffer(bytearray(payload), dtype=torch.int64).reshape(batch, length)
        with torch.no_grad():
            out = _logits(model, idx)
        if not isinstance(out, torch.Tensor):
            _send(fd_out, {"error": f"forward returned {type(out).__name__}, not a logits tensor"})
            return
        out = out.detach().to("cpu", torch.float32).contiguous()
        _send(fd_out, {"shape": list(out.shape)}, out.numpy().tobytes())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-py", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--prepare")
    parser.add_argument("--inference-py")
    parser.add_argument("--fd-in", type=int, required=True)
    parser.add_argument("--fd-out", type=int, required=True)
    args = parser.parse_args()
    try:
        import torch

        torch.manual_seed(0)
        model, changed = _load(args)
        _send(args.fd_out, {"ready": True, "prepare_changed": changed, **_inspect_loaded(model)})
    except BaseException as exc:  # report the failure as data; verify turns it into a check
        _send(args.fd_out, {"error": traceback.format_exception_only(type(exc), exc)[-1].strip()[:400]})
        return 1
    try:
        _serve(model, args.fd_in, args.fd_out, os.path.dirname(os.path.abspath(args.train_py)) + os.sep)
    except EOFError:
        return 0
    except BaseException as exc:
        _send(args.fd_out, {"error": traceback.format_exception_only(type(exc), exc)[-1].strip()[:400]})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
