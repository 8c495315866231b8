"""verify's side of the model server: start it in the sandbox, ask for logits, trust nothing it says.

``ServedModel`` starts ``modelserver.py`` inside the sandbox (the only process where the
archive's train.py runs) and exchanges tokens for logits over two pipes. Every reply is
checked before use: the header is small JSON, the shape is exactly the batch asked for
times a bounded vocabulary, the payload is exactly that many float32 values. A wall
deadline kills the sandbox's process tree (which ends any blocked read with EOF).

``RemoteModel`` wraps it as an ``nn.Module`` whose forward is that exchange, so the
trusted ``evaluate_bpb`` and the contract checks run in verify's process on logits only.
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
from trnfrontier.untrusted import sandbox

SERVER = Path(__file__).with_name("modelserver.py")
MAX_VOCAB = 1 << 17
CLOSE_GRACE_SECONDS = 2.0
_MAX_HEADER = 1 << 16


class ServerError(RuntimeError):
    """The served model failed, lied about its output, or ran out of time."""


@dataclass
class ServedModel:
    """A model loaded by the archive's load_for_eval inside the sandbox."""

    proc: Any
    fd_to: int
    fd_from: int
    deadline_timer: threading.Timer
    info: dict[str, Any] = field(default_factory=dict)
    log: Path | None = None
    timed_out: bool = False

    # -- lifecycle -------------------------------------------------------------------
    @classmethod
    def start(cls, *, root: Path, checkpoint: Path, prepare: Path | None, scratch: Path,
              timeout: float, sandboxed: bool, python: str | None = None, read_only: tuple[Path, ...] = (),
              inference_py: Path | None = None) -> ServedModel:
        """Start the server on the archive extracted at ``root`` (read-only inside the sandbox;
        ``read_only``: more paths it needs, such as a clean venv). With ``inference_py`` the
        model is the one that file loads (Phase 2), served through ``logprobs``."""
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        argv = [python or sys.executable, "-I", "-B", str(SERVER), "--train-py", str(root / "train.py"), "--checkpoint", str(checkpoint),
                "--fd-in", str(to_r), "--fd-out", str(from_w)]
        visible = [root, SERVER, *read_only]
        if inference_py is not None:
            argv += ["--inference-py", str(inference_py)]
        if prepare is not None:
            argv += ["--prepare", str(prepare)]
            visible.append(prepare)
        env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "LANG": "C.UTF-8"}
        jail = sandbox.Jail(scratch=scratch, env=env, read_only=tuple(visible), cwd=root)
        log = scratch / ".server.log"
        # bwrap passes inherited descriptors through, so the server uses the same numbers.
        try:
            with open(log, "wb") as sink:
                proc = sandbox.popen(argv, jail, sandbox.Limits(wall_seconds=timeout), sandboxed=sandboxed,
                                     pass_fds=(to_r, from_w), stdout=sink)
        finally:
            os.close(to_r)
            os.close(from_w)
        served = cls(proc, to_w, from_r, threading.Timer(timeout, lambda: None), log=log)
        served.deadline_timer = threading.Timer(timeout, served._expire)
        served.deadline_timer.daemon = True
        served.deadline_timer.start()
        try:
            header = served._message()
        except ServerError:
            served.close()
            raise
        if "error" in header:
            served.close()
            raise ServerError(f"load_for_eval failed: {header['error']}")
        if not header.get("ready"):
            served.close()
            raise ServerError("the model server sent no ready message")
        served.info = header
        return served

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

    def __enter__(self) -> ServedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tail(self) -> str:
        """The last line the server (train.py included) printed, for a failure message."""
        try:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()] if self.log else []
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    # -- wire ------------------------------------------------------------------------
    def _read_exact(self, n: int) -> bytes:
        chunks, left = [], n
        while left:
            try:
                block = os.read(self.fd_from, min(left, 1 << 22))
            except OSError:
                block = b""
            if not block:
                if self.timed_out:
                    raise ServerError("timed out (the sandbox was killed)")
                last = self.tail()
                raise ServerError(f"the model server died{': ' + last if last else ''}")
            chunks.append(block)
            left -= len(block)
        return b"".join(chunks)

    def _header(self) -> dict[str, Any]:
        (size,) = struct.unpack("<I", self._read_exact(4))
        if size > _MAX_HEADER:
            raise ServerError(f"the model server sent a {size}-byte header (protocol violation)")
        try:
            header = json.loads(self._read_exact(size))
        except (ValueError, RecursionError):
            raise ServerError("the model server sent a malformed header (protocol violation)") from None
        if not isinstance(header, dict):
            raise ServerError("the model server sent a malformed header (protocol violation)")
        return header

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
            raise ServerError("timed out (the sandbox was killed)" if self.timed_out else f"the model server died: {self.tail()}") from None

    def forward(self, idx: Any) -> Any:
        """Logits [B, T, V] (float32) for int tokens ``idx`` [B, T]."""
        tokens = _int64(idx)
        return self._exchange({"op": "forward", "shape": list(tokens.shape)}, tokens, list(tokens.shape), "forward")

    def logprobs(self, idx: Any) -> Any:
        """inference.py's next-token log-probabilities [B, T, V] for tokens ``idx`` [B, T]."""
        tokens = _int64(idx)
        return self._exchange({"op": "logprobs", "shape": list(tokens.shape)}, tokens, list(tokens.shape), "next_token_logprobs")

    def logprobs_after(self, prefix: Any, rows: Any, owner: Any) -> Any:
        """inference.py's log-probabilities [R, S, V] of ``prefix[owner[r]] + rows[r]`` at the rows' positions."""
        import torch

        parts = [_int64(prefix), _int64(rows), _int64(owner)]
        header = {"op": "logprobs_after", "shapes": [list(t.shape) for t in parts]}
        flat = torch.cat([t.reshape(-1) for t in parts])
        return self._exchange(header, flat, list(parts[1].shape), "next_token_logprobs_after")

    def _exchange(self, header: dict[str, Any], tokens: Any, leading: list[int], what: str) -> Any:
        """Send ``header`` + int64 ``tokens``; the float32 [*leading, V] reply, judged before use."""
        import torch

        self._send(header, tokens.numpy().tobytes())
        # The shape is judged before a byte of payload is read: a lying server cannot make verify allocate.
        reply = self._header()
        if "error" in reply:
            raise ServerError(f"{what} failed: {str(reply['error'])[:300]}")
        shape = reply.get("shape")
        if not (isinstance(shape, list) and len(shape) == 3 and shape[:2] == leading
                and isinstance(shape[2], int) and 1 <= shape[2] <= MAX_VOCAB):
            raise ServerError(f"{what} returned shape {str(shape)[:80]}, expected [{leading[0]}, {leading[1]}, vocab <= {MAX_VOCAB}]")
        if reply.get("nbytes") != leading[0] * leading[1] * shape[2] * 4:
            raise ServerError(f"{what} announced a payload that does not match its shape (protocol violation)")
        if "shares_prefixes" in reply:
            self.info["shares_prefixes"] = bool(reply["shares_prefixes"])
        payload = bytearray(self._read_exact(reply["nbytes"]))
        return torch.frombuffer(payload, dtype=torch.float32).reshape(leading[0], leading[1], shape[2])

    def inspect(self) -> dict[str, Any]:
        self._send({"op": "inspect"})
        header = self._message()
        return header


def _int64(t: Any) -> Any:
    import torch

    return t.detach().to("cpu", torch.int64).contiguous()


def remote_module(served: ServedModel) -> Any:
    """An ``nn.Module`` whose forward is the served model's: what the trusted scorer is handed."""
    import torch

    class RemoteModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # Scorers may ask a model for its device or dtype through a parameter.
            self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

        def forward(self, idx: Any, *args: Any, **kwargs: Any) -> Any:
            if args or kwargs:
                raise TypeError("the served model takes only the token tensor (the scorer recomputes the loss from logits)")
            return served.forward(idx)

    return RemoteModel().eval()
