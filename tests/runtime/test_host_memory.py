"""runtime/host_memory.py: glibc keeps a CPU step's large tensors in its heap."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from trnfrontier.runtime.host_memory import keep_freed_memory

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's"
)

# In a child process: the policy is process-wide and would outlive the test otherwise.
# mallinfo2().hblkhd is the bytes glibc holds in mmap'd blocks; a 64 MiB tensor is above
# every mmap threshold glibc allows, so by default it is one of them.
_PROBE = textwrap.dedent(
    """
    import ctypes, json, sys
    import torch
    from trnfrontier.runtime.host_memory import keep_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    applied = keep_freed_memory(sys.argv[1])
    before = libc.mallinfo2().hblkhd
    tensor = torch.empty(16 * 2**20, dtype=torch.float32).fill_(1.0)
    during = libc.mallinfo2().hblkhd
    del tensor
    again = torch.empty(16 * 2**20, dtype=torch.float32).fill_(2.0)
    print(json.dumps({"applied": applied, "mapped": during - before, "arena": libc.mallinfo2().arena}))
    """
)


def _probe(device_type: str, env_extra: dict[str, str] | None = None) -> dict[str, int]:
    import os

    env = {**os.environ, **(env_extra or {})}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, device_type], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_cpu_training_keeps_large_tensors_in_the_heap() -> None:
    kept = _probe("cpu")
    assert kept["applied"] is True
    assert kept["mapped"] == 0  # served from the heap
    assert kept["arena"] >= 64 * 2**20  # ... which kept it for the next allocation
    default = _probe("cpu", {"TRNF_HOST_MALLOC": "system"})
    assert default["applied"] is False
    assert default["mapped"] >= 64 * 2**20  # glibc's default maps it (the check can fail)


def test_only_cpu_training_and_never_when_the_user_opts_out() -> None:
    assert keep_freed_memory("cuda") is False
    assert keep_freed_memory("neuron") is False
    assert keep_freed_memory("cpu", {"TRNF_HOST_MALLOC": "system"}) is False
