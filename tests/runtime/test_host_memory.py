"""runtime/host_memory.py: a CPU training process is started with glibc keeping freed blocks."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from trnfrontier.runtime.host_memory import KEEP_FREED, keep_freed_env, kept

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="the tunables are glibc's"
)

# mallinfo2().hblkhd is the bytes glibc holds in mmap'd blocks: by default a 64 MiB tensor
# (above every mmap threshold glibc allows) is one; kept, it comes from the heap, which
# still holds it after it is freed.
_PROBE = textwrap.dedent(
    """
    import ctypes, json
    import torch
    from trnfrontier.runtime.host_memory import kept

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    before = libc.mallinfo2().hblkhd
    tensor = torch.empty(16 * 2**20, dtype=torch.float32).fill_(1.0)
    mapped = libc.mallinfo2().hblkhd - before
    del tensor
    print(json.dumps({"kept": kept(), "mapped": mapped, "arena": libc.mallinfo2().arena}))
    """
)


def _probe(extra: dict[str, str]) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k not in KEEP_FREED}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env={**env, **extra}, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_a_process_started_with_the_variables_keeps_large_tensors_in_the_heap() -> None:
    with_env = _probe(keep_freed_env("cpu", {}))
    assert with_env["kept"] is True
    assert with_env["mapped"] == 0  # served from the heap
    assert with_env["arena"] >= 64 * 2**20  # ... which keeps it after the free
    default = _probe({})
    assert default["kept"] is False
    assert default["mapped"] >= 64 * 2**20  # glibc's default maps it (the check can fail)


def test_only_host_training_and_never_over_the_users_choice() -> None:
    assert keep_freed_env("cpu", {}) == KEEP_FREED
    assert keep_freed_env("auto", {}) == KEEP_FREED
    assert keep_freed_env("cuda", {}) == {}
    assert keep_freed_env("neuron", {}) == {}
    assert keep_freed_env("cpu", {"TRNF_HOST_MALLOC": "system"}) == {}
    assert keep_freed_env("cpu", {"MALLOC_TRIM_THRESHOLD_": "0"}) == {}  # the user tuned glibc
    assert kept({"MALLOC_MMAP_MAX_": "0"}) and not kept({})


def test_trnf_train_starts_a_cpu_run_with_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from trnfrontier.recipes.loading import load_recipe
    from trnfrontier.train.plan import launch_env

    for name in (*KEEP_FREED, "TRNF_HOST_MALLOC"):
        monkeypatch.delenv(name, raising=False)
    recipe = load_recipe("cpu_smoke")
    assert {k: launch_env(recipe).get(k) for k in KEEP_FREED} == KEEP_FREED
    monkeypatch.setenv("TRNF_HOST_MALLOC", "system")
    assert not any(k in launch_env(recipe) for k in KEEP_FREED)
