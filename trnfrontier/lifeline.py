"""Processes that die with trnf: Linux's parent-death signal, set where trnf launches.

`trnf train` starts its trainer in a session of its own (so that stopping it reaches the
whole tree), which also means ``kill -9`` of trnf's process group does not reach it: the
orphan trained on and wrote ``final/``. So every process between trnf and the training
code asks the kernel (``prctl(PR_SET_PDEATHSIG, SIGKILL)``) to be killed when its parent
dies: the direct child in ``processes.start(die_with_parent=True)`` (between fork and
exec, so it holds for torchrun too; SIGTERM there, on which torchrun stops its workers,
which covers a kit's own train.py), and each trainer process again, with SIGKILL, in
``trnfrontier.train.worker`` (torchrun's workers are torchrun's children, not ours).

The signal only covers a parent that dies *after* it is set, so each process then checks
that its parent is still the one that started it and that trnf itself (``SUPERVISOR_ENV``,
pid and start time) is still alive, and kills itself otherwise.

The signal follows the *thread* that started the child: launch from the main thread.
Linux only; elsewhere these are no-ops and the tree is stopped the ordinary way.
Tool layer (ctypes): the runtime a submission carries never imports this.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

from trnfrontier.processes import Proc, identify, is_alive

SUPERVISOR_ENV = "TRNF_SUPERVISOR"
_PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def set_parent_death_signal(sig: int = signal.SIGKILL, libc: ctypes.CDLL | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits."""
    libc = libc or _libc()
    if libc is None:
        return False
    return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0


def preexec(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``Popen(preexec_fn=...)`` that sets the parent-death signal in the child and
    exits at once if the parent already died between fork and this call."""
    parent = os.getpid()
    libc = _libc()  # loaded before the fork: no dlopen in the child

    def child() -> None:
        if libc is not None and set_parent_death_signal(sig, libc) and os.getppid() != parent:
            os._exit(1)

    return child


def supervisor_env() -> dict[str, str]:
    """What a launched tree is told about trnf (pid and start time), for ``die_with_parent``."""
    me = identify(os.getpid())
    return {SUPERVISOR_ENV: f"{me.pid}:{me.start}"} if me else {}


def _supervisor_gone(value: str | None) -> bool:
    if not value:
        return False
    try:
        pid, start = (int(part) for part in value.split(":"))
    except ValueError:
        return False
    return not is_alive(Proc(pid, start))


def die_with_parent(first_parent: int) -> None:
    """In a launched process: be killed when the parent dies, and die now if the parent
    (``first_parent``, read at startup) or trnf itself is already gone."""
    if not set_parent_death_signal():
        return
    if os.getppid() != first_parent or _supervisor_gone(os.environ.get(SUPERVISOR_ENV)):
        os.kill(os.getpid(), signal.SIGKILL)
