"""Keep torch.profiler's native log lines (``USDT: ... profiler_start``) off the terminal.

Kineto writes them from C++ straight to file descriptor 2 whatever Python's logging says,
and no environment variable silences them. While the profiler starts and stops, fd 2
goes to a temporary file; afterwards every line that is not such a notice is written back
to stderr, so a real warning is never lost.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

NOISE = re.compile(r"^USDT:.*(profiler_start|profiler_stop)")


@contextmanager
def without_profiler_noise() -> Iterator[None]:
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 to redirect (a daemon): nothing can reach a terminal anyway
        yield
        return
    with tempfile.TemporaryFile() as captured:
        sys.stderr.flush()
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [
                line for line in captured.read().decode("utf-8", "replace").splitlines()
                if not NOISE.match(line)
            ]
            if kept:
                sys.stderr.write("\n".join(kept) + "\n")
