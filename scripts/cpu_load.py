"""Keep N CPU cores busy until stopped: `scripts/test.sh --under-load` runs the suite beside it.

    python scripts/cpu_load.py N

Each worker spins in pure Python. Every worker also exits on its own when the process that
started this script is gone, so a killed test run never leaves busy loops behind.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time


def _spin(watched: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, not the terminal's Ctrl-C
    checked = time.monotonic()
    while True:
        sum(range(10_000))
        if time.monotonic() - checked > 0.5:
            checked = time.monotonic()
            if os.getppid() != watched:
                return


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else os.cpu_count() or 1
    owner = os.getppid()  # whoever started us (scripts/test.sh)
    workers = [multiprocessing.Process(target=_spin, args=(os.getpid(),), daemon=True) for _ in range(count)]
    for worker in workers:
        worker.start()

    def stop(*_: object) -> None:
        for worker in workers:
            worker.terminate()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while os.getppid() == owner:
        time.sleep(0.5)
    stop()


if __name__ == "__main__":
    main()
