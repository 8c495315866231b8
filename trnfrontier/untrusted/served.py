"""verify's side of the model server: start it in the sandbox, ask for logits, trust nothing it says.

``ServedModel`` starts ``modelserver.py`` inside the sandbox (the only process where the
archive's train.py runs) and exchanges tokens for logits over two pipes. Every reply is
checked before use: the header is small JSON, the shape is exactly the batch asked for
times a bounded vocabulary, the payload is exactly that many float32 values. A wall
deadline kills the sandbox's process tree (which ends any blocked read with EOF).

One environment for every server: whichever check starts it (the contract probe, the
scored pass, a dry run's load), train.py sees the same paths (the archive at
``INSIDE_ROOT``, HOME and TMPDIR a private tmpfs at ``/scratch``), the same variables and
the same kind of requests, so nothing but the tokens it is given tells one use from another.
What the server prints goes into a bounded in-memory tail (``TailPipe``), never a file.

The interface other checks build on (an inference.py check, say):

- ``ServedModel.start(...)`` -> a ready server (``info``: what it said when ready);
  ``start_all(n, ...)``: n servers loading at once, each in its own sandbox, identical;
- ``forward(idx)``: float32 logits ``[B, T, V]`` for int tokens ``[B, T]``;
  ``send_forward`` / ``receive_forward``: the same in two halves, so several servers
  compute at once; with ``inference_py`` (Phase 2) ``logprobs`` and ``logprobs_after``
  ask the model inference.py loads;
- ``inspect()``: hooks, training-mode modules, what train.py tried that the sandbox blocked;
- ``tensors()``: every tensor reachable from the loaded model, by name (``identity.py``);
- ``breach()``: the tree limit (memory, processes and threads) the server ran into, if any;
- ``close()`` (or ``with``): ends the server and everything it started.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trnfrontier import processes
from trnfrontier.contract.jsonstrict import StrictJSONError, strict_loads
from trnfrontier.untrusted import sandbox
from trnfrontier.untrusted.tailpipe import TailPipe

SERVER = Path(__file__).with_name("modelserver.py")
INSIDE_ROOT = "/submission"
INSIDE_SERVER = "/opt/trnf/modelserver.py"
INSIDE_PREPARE = "/opt/trnf/prepare.py"
MAX_VOCAB = 1 << 17
CLOSE_GRACE_SECONDS = 2.0
_MAX_HEADER = 1 << 16
MAX_REPORT_BYTES = 16 << 20  # a tensors() report: names, shapes and digests, never data


class ServerError(RuntimeError):
    """The served model failed, lied about its output, or ran out of time."""


def server_threads() -> str:
    """OMP_NUM_THREADS of every server: the user's when set, else half the cores (two servers
    answer the scored pass at once). The same for every server of a run."""
    return os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // 2))


@dataclass
class ServedModel:
    """A model loaded by the archive's load_for_eval inside the sandbox."""

    started: sandbox.Started
    fd_to: int
    fd_from: int
    deadline_timer: threading.Timer
    output: TailPipe
    info: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False
    _pending: tuple[int, int] | None = None
    # The widest logits reply accepted (judged from its header, before any payload is read);
    # callers that know the vocabulary narrow it to that + a little.
    vocab_limit: int = MAX_VOCAB

    # -- lifecycle -------------------------------------------------------------------
    @classmethod
    def start(cls, *, root: Path, checkpoint: Path, prepare: Path | None, timeout: float, sandboxed: bool,
              scratch: Path | None = None, python: str | None = None, read_only: tuple[Path, ...] = (),
              inference_py: Path | None = None) -> ServedModel:
        """Start the server on the archive extracted at ``root`` (read-only, at ``INSIDE_ROOT`` in
        the sandbox); ``checkpoint`` (and ``inference_py``) lie under ``root``. ``read_only``: more
        paths it needs at their own paths (a clean venv). ``scratch``: a host directory for HOME,
        needed only unsandboxed (the sandbox gives it a private tmpfs). With ``inference_py`` the
        model is the one that file loads (Phase 2), served through ``logprobs``."""
        served = cls._launch(root=root, checkpoint=checkpoint, prepare=prepare, timeout=timeout, sandboxed=sandboxed,
                             scratch=scratch, python=python, read_only=read_only, inference_py=inference_py)
        served._ready()
        return served

    @classmethod
    def start_all(cls, count: int, *, root: Path, checkpoint: Path, prepare: Path | None, timeout: float, sandboxed: bool,
                  scratches: tuple[Path | None, ...] = ()) -> list[ServedModel]:
        """``count`` identical servers, loading at the same time; all or none (ServerError)."""
        servers: list[ServedModel] = []
        try:
            for i in range(count):
                servers.append(cls._launch(root=root, checkpoint=checkpoint, prepare=prepare, timeout=timeout, sandboxed=sandboxed,
                                           scratch=scratches[i] if scratches else None))
            for served in servers:
                served._ready(close_on_error=False)
        except BaseException:
            for served in servers:
                served.close()
            raise
        return servers

    @classmethod
    def _launch(cls, *, root: Path, checkpoint: Path, prepare: Path | None, timeout: float, sandboxed: bool,
                scratch: Path | None = None, python: str | None = None, read_only: tuple[Path, ...] = (),
                inference_py: Path | None = None) -> ServedModel:
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        jail, paths = _jail(root, checkpoint, prepare, sandboxed, scratch, read_only)
        argv = [python or sys.executable, "-I", "-B", paths["server"], "--train-py", paths["train"], "--checkpoint",
                paths["checkpoint"], "--fd-in", str(to_r), "--fd-out", str(from_w)]
        if inference_py is not None:
            argv += ["--inference-py", _inside(root, inference_py, sandboxed)]
        if prepare is not None:
            argv += ["--prepare", paths["prepare"]]
        output = TailPipe()
        # bwrap passes inherited descriptors through, so the server uses the same numbers.
        try:
            started = sandbox.popen(argv, jail, sandbox.Limits(wall_seconds=timeout), sandboxed=sandboxed,
                                    pass_fds=(to_r, from_w), stdout=output.write_fd)
        except BaseException:
            os.close(to_w)
            os.close(from_r)
            raise
        finally:
            os.close(to_r)
            os.close(from_w)
            output.started()
        served = cls(started, to_w, from_r, threading.Timer(timeout, lambda: None), output)
        served.deadline_timer = threading.Timer(timeout, served._expire)
        served.deadline_timer.daemon = True
        served.deadline_timer.start()
        return served

    def _ready(self, close_on_error: bool = True) -> None:
        """Wait for the server's first message: ready, or why load_for_eval failed."""
        try:
            header = self._message()
            if "error" in header:
                raise ServerError(f"load_for_eval failed: {str(header['error'])[:400]}")
            if header.get("ready") is not True:
                raise ServerError("the model server sent no ready message")
        except ServerError:
            if close_on_error:
                self.close()
            raise
        self.info = header

    @property
    def proc(self) -> Any:
        return self.started.proc

    def breach(self) -> str:
        """The tree limit (memory, processes and threads) this server ran into, '' when none."""
        return self.started.breach()

    def _expire(self) -> None:
        self.timed_out = True
        self.kill()

    def kill(self) -> None:
        # bwrap's death takes its PID namespace with it (--die-with-parent); stop_tree
        # also covers the unsandboxed case.
        processes.stop_tree(self.proc, grace=0.2)

    def close(self) -> None:
        """End the server: closing its pipes makes it exit; whatever is left after a moment is killed."""
        self.deadline_timer.cancel()
        for fd in (self.fd_to, self.fd_from):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=CLOSE_GRACE_SECONDS)
        except Exception:  # noqa: BLE001 - TimeoutExpired, or an already reaped process: kill below either way
            pass
        self.kill()
        self.started.guard.close()
        self.output.join()

    def __enter__(self) -> ServedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _why_gone(self) -> str:
        """Why the server stopped answering: the wall limit, a tree limit, or what it printed last."""
        if self.timed_out:
            return "timed out (the sandbox was killed)"
        try:
            self.proc.wait(timeout=1.0)
        except Exception:  # noqa: BLE001 - still running or already reaped: the counters say enough
            pass
        breach = self.breach()
        if breach:
            return f"the sandboxed process tree ran into {breach} and was stopped"
        self.output.join(0.5)
        last = self.tail()
        return f"the model server died{': ' + last if last else ''}"

    def tail(self) -> str:
        """The last line the server (train.py included) printed, for a failure message."""
        return self.output.last_line()

    # -- wire ------------------------------------------------------------------------
    def _read_exact(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            try:
                block = os.read(self.fd_from, min(left, 1 << 22))
            except OSError:
                block = b""
            if not block:
                raise ServerError(self._why_gone())
            chunks.append(block)
            left -= len(block)
        return b"".join(chunks)

    def _header(self) -> dict[str, Any]:
        (size,) = struct.unpack("<I", self._read_exact(4))
        if size > _MAX_HEADER:
            raise ServerError(f"the model server sent a {size}-byte header (protocol violation)")
        try:
            header = strict_loads(self._read_exact(size), what="the model server's header")
        except StrictJSONError:
            raise ServerError("the model server sent a malformed header (protocol violation)") from None
        if not isinstance(header, dict):
            raise ServerError("the model server sent a malformed header (protocol violation)")
        return _typed(header)

    def _message(self) -> dict[str, Any]:
        """A message without payload (ready, inspect, error): a payload here is a protocol violation."""
        header = self._header()
        if header.get("nbytes", 0) != 0:
            raise ServerError(f"the model server announced {str(header.get('nbytes'))[:20]} payload bytes (protocol violation)")
        return header

    def _send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        raw = json.dumps(dict(header, nbytes=len(payload))).encode()
        view = memoryview(struct.pack("<I", len(raw)) + raw + payload)
        try:
            while view:
                view = view[os.write(self.fd_to, view):]
        except OSError:
            raise ServerError(self._why_gone()) from None

    def send_forward(self, idx: Any) -> None:
        """Ask for the logits of int tokens ``idx`` [B, T]; ``receive_forward`` reads them."""
        tokens = _int64(idx)
        self._send_tokens({"op": "forward", "shape": list(tokens.shape)}, tokens, list(tokens.shape))

    def receive_forward(self, vocab_limit: int | None = None) -> Any:
        """Logits [B, T, V] (float32) of the last ``send_forward``; V at most ``vocab_limit`` (default: the server's)."""
        return self._receive_logits("forward", vocab_limit)

    def forward(self, idx: Any, vocab_limit: int | None = None) -> Any:
        """Logits [B, T, V] (float32) for int tokens ``idx`` [B, T]."""
        self.send_forward(idx)
        return self.receive_forward(vocab_limit)

    def logprobs(self, idx: Any) -> Any:
        """inference.py's next-token log-probabilities [B, T, V] for tokens ``idx`` [B, T]."""
        tokens = _int64(idx)
        self._send_tokens({"op": "logprobs", "shape": list(tokens.shape)}, tokens, list(tokens.shape))
        return self._receive_logits("next_token_logprobs")

    def logprobs_after(self, prefix: Any, rows: Any, owner: Any) -> Any:
        """inference.py's log-probabilities [R, S, V] of ``prefix[owner[r]] + rows[r]`` at the rows' positions."""
        import torch

        parts = [_int64(prefix), _int64(rows), _int64(owner)]
        header = {"op": "logprobs_after", "shapes": [list(t.shape) for t in parts]}
        self._send_tokens(header, torch.cat([t.reshape(-1) for t in parts]), list(parts[1].shape))
        return self._receive_logits("next_token_logprobs_after")

    def _send_tokens(self, header: dict[str, Any], tokens: Any, leading: list[int]) -> None:
        """Send ``header`` + int64 ``tokens``; the reply, ``leading`` + [V], is read by ``_receive_logits``."""
        self._send(header, tokens.numpy().tobytes())
        self._pending = (int(leading[0]), int(leading[1]))

    def _receive_logits(self, what: str, vocab_limit: int | None = None) -> Any:
        """The float32 [*leading, V] reply to the last request, judged before a byte of payload is read:
        a lying server cannot make verify allocate."""
        import torch

        vocab_limit = self.vocab_limit if vocab_limit is None else vocab_limit

        if self._pending is None:
            raise ServerError(f"no {what} request is pending")
        (batch, length), self._pending = self._pending, None
        reply = self._header()
        if "error" in reply:
            raise ServerError(f"{what} failed: {str(reply['error'])[:300]}")
        shape = reply.get("shape")
        if not (isinstance(shape, list) and len(shape) == 3 and shape[:2] == [batch, length]
                and isinstance(shape[2], int) and not isinstance(shape[2], bool) and 1 <= shape[2] <= vocab_limit):
            raise ServerError(f"{what} returned shape {str(shape)[:80]}, expected [{batch}, {length}, vocab <= {vocab_limit}]")
        if type(reply.get("nbytes")) is not int or reply["nbytes"] != batch * length * shape[2] * 4:
            raise ServerError(f"{what} announced a payload that does not match its shape (protocol violation)")
        if "shares_prefixes" in reply:
            self.info["shares_prefixes"] = reply["shares_prefixes"]
        payload = bytearray(self._read_exact(reply["nbytes"]))
        return torch.frombuffer(payload, dtype=torch.float32).reshape(batch, length, shape[2])

    def inspect(self) -> dict[str, Any]:
        self._send({"op": "inspect"})
        return self._message()

    def tensors(self) -> dict[str, Any]:
        """What the server says the loaded model holds (``identity.py`` judges it): a bounded JSON report."""
        self._send({"op": "tensors"})
        header = self._header()
        if "error" in header:
            raise ServerError(f"listing the model's tensors failed: {str(header['error'])[:300]}")
        size = header.get("nbytes")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_REPORT_BYTES:
            raise ServerError(f"the model server announced a {str(size)[:20]}-byte tensor report (limit {MAX_REPORT_BYTES:,})")
        try:
            report = strict_loads(self._read_exact(size), what="the model server's tensor report")
        except StrictJSONError as exc:
            raise ServerError(str(exc)) from None
        if not isinstance(report, dict):
            raise ServerError("the model server's tensor report is not a JSON object")
        return report


# The type of every header field verify reads (shape and nbytes are judged where they are used):
# train.py runs in the server's process and can write a frame of its own to the result pipe,
# so a field of another type is a refusal here, never a TypeError in a check that reads it.
_LIST_FIELDS = ("prepare_changed", "hooks", "training", "attempts", "filled")
_TYPED_FIELDS: dict[str, tuple[type, str]] = {"ready": (bool, "true or false"), "shares_prefixes": (bool, "true or false"),
                                               "error": (str, "a string")}


def _typed(header: dict[str, Any]) -> dict[str, Any]:
    """``header`` when every field verify reads has its type, else ServerError naming the field."""
    for name in _LIST_FIELDS:
        value = header.get(name, [])
        if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise ServerError(f"the model server's reply gives {name!r} as {_kind(value)}, not a list of strings (protocol violation)")
    for name, (kind, words) in _TYPED_FIELDS.items():
        if name in header and not isinstance(header[name], kind):
            raise ServerError(f"the model server's reply gives {name!r} as {_kind(header[name])}, not {words} (protocol violation)")
    return header


def _kind(value: Any) -> str:
    """A JSON value's kind in words (never its content, which the sandbox chose)."""
    if isinstance(value, list):
        return "a list holding " + ", ".join(sorted({type(item).__name__ for item in value}))
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object"}.get(type(value), "null")


def _int64(t: Any) -> Any:
    import torch

    return t.detach().to("cpu", torch.int64).contiguous()


def _inside(root: Path, path: Path, sandboxed: bool) -> str:
    """``path`` (under ``root``) as the server sees it."""
    return f"{INSIDE_ROOT}/{path.relative_to(root).as_posix()}" if sandboxed else str(path)


def _jail(root: Path, checkpoint: Path, prepare: Path | None, sandboxed: bool, scratch: Path | None,
          read_only: tuple[Path, ...]) -> tuple[sandbox.Jail, dict[str, str]]:
    """The server's jail and the paths its command line names (inside the sandbox when sandboxed)."""
    env = {"OMP_NUM_THREADS": server_threads(), "LANG": "C.UTF-8"}
    paths = {"train": _inside(root, root / "train.py", sandboxed), "checkpoint": _inside(root, checkpoint, sandboxed),
             "server": INSIDE_SERVER if sandboxed else str(SERVER), "prepare": INSIDE_PREPARE if sandboxed else str(prepare)}
    if not sandboxed:
        if scratch is None:
            raise ServerError("an unsandboxed server needs a scratch directory")
        return sandbox.Jail(scratch=scratch, env=env, cwd=root), paths
    placed = [(root, INSIDE_ROOT), (SERVER, INSIDE_SERVER)] + ([(prepare, INSIDE_PREPARE)] if prepare is not None else [])
    return sandbox.Jail(scratch=None, env=env, read_only=read_only, placed=tuple(placed), cwd=INSIDE_ROOT), paths


def remote_module(source: Any) -> Any:
    """An ``nn.Module`` whose forward is ``source``'s (a ``ServedModel``, or any tokens -> logits
    callable such as ``verify.mixing.MixedPass``): what a trusted scorer is handed."""
    import torch

    forward = source.forward if isinstance(source, ServedModel) else source

    class RemoteModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # Scorers may ask a model for its device or dtype through a parameter.
            self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

        def forward(self, idx: Any, *args: Any, **kwargs: Any) -> Any:
            if args or kwargs:
                raise TypeError("the served model takes only the token tensor (the scorer recomputes the loss from logits)")
            return forward(idx)

    return RemoteModel().eval()
