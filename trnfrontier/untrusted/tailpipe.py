"""What a sandboxed process prints, kept in memory and bounded: the last bytes only.

A sandboxed process's stdout and stderr go into a pipe, never into a file: a file could be
swapped for a symlink by the process (and read back by verify), and a newline bomb would
fill a disk. A daemon thread drains the pipe as fast as the process writes and keeps the
last ``keep`` bytes; the total is counted. ``text()`` is what a failure message may quote.
"""

from __future__ import annotations

import os
import threading
from collections import deque


class TailPipe:
    """A pipe whose read end is drained by a thread into a ring of the last ``keep`` bytes.

    Give ``write_fd`` to the child as its stdout; call ``started()`` once the child has it
    (verify's copy of the write end is closed, so the drain ends when the child's tree does)."""

    def __init__(self, keep: int = 16 << 10) -> None:
        self.keep = keep
        self.total = 0
        self._ring: deque[bytes] = deque()
        self._held = 0
        self._lock = threading.Lock()
        read_fd, self.write_fd = os.pipe()
        self._thread = threading.Thread(target=self._drain, args=(read_fd,), daemon=True)
        self._thread.start()

    def _drain(self, fd: int) -> None:
        try:
            while block := os.read(fd, 1 << 16):
                with self._lock:
                    self.total += len(block)
                    self._ring.append(block)
                    self._held += len(block)
                    while self._held - len(self._ring[0]) >= self.keep:
                        self._held -= len(self._ring.popleft())
        except OSError:
            pass
        finally:
            os.close(fd)

    def started(self) -> None:
        """The child holds the write end now: drop ours."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def join(self, timeout: float = 2.0) -> None:
        self.started()
        self._thread.join(timeout)

    def text(self) -> str:
        with self._lock:
            data = b"".join(self._ring)[-self.keep:]
        return data.decode("utf-8", "replace")

    def last_line(self, limit: int = 300) -> str:
        """The last non-empty line printed (a failure's one-line reason), at most ``limit`` characters."""
        lines = [line for line in self.text().splitlines() if line.strip()]
        return lines[-1][:limit] if lines else ""
