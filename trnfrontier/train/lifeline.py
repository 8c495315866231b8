"""A trainer that dies with trnf: the trainer's half of binding a run to `trnf train`.

`trnf train` starts its trainer in a session of its own (so that stopping it reaches the
whole tree), which also means ``kill -9`` of trnf's process group does not reach it: the
orphan trained on and wrote ``final/``. So every process between trnf and the training
code asks the kernel to be killed when its parent dies: the direct child through
``processes.start(die_with_parent=True)`` (between fork and exec, so it holds for torchrun
too; SIGTERM there, on which torchrun stops its workers), and each trainer process again,
with SIGKILL, in ``trnfrontier.train.worker`` (torchrun's workers are torchrun's
children, not ours) through ``die_with_parent`` here.

The signal only covers a parent that dies *after* it is set, so each process then checks
that its parent is still the one that started it and that trnf itself (``SUPERVISOR_ENV``,
pid and start time) is still alive, and kills itself otherwise.

Linux only; elsewhere these are no-ops and the tree is stopped the ordinary way.
Tool layer (ctypes): the runtime a submission carries never imports this.
"""

from __future__ import annotations

import os
import signal

from trnfrontier.processes import Proc, identify, is_alive, set_parent_death_signal

SUPERVISOR_ENV = "TRNF_SUPERVISOR"


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
