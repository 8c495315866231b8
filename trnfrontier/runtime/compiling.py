"""``runtime.compile``: whether a run compiles, what it compiles, and where the cache lives.

``auto`` (the default) compiles on CPU and CUDA, where torch.compile (inductor) pays for
itself within a run: the compiled step is faster and the compile time falls in the
startup steps the organisers' clock does not charge. On Neuron ``auto`` stays eager and
``true`` compiles with the neuron backend (the recipe decides, as issue 12 asks).

What compiles, with ``dynamic=False`` (a training step's shapes never change): the
training loss module (forward and backward through AOTAutograd), and the optimizers'
update functions (``muon.muon_update`` per bucket shape, ``optim.adamw_update`` per
param group), which are pure functions of their tensors so that a moving LR schedule,
or a fresh gradient tensor every step, never re-traces them.

The inductor/triton caches go under the data home (``$TRNF_HOME/compile``) unless the
environment already names them, so a second run on the same machine starts warm.
``TRNF_COMPILE`` (``0``/``off`` or ``1``/``on``) overrides ``auto`` for one process
tree; the test suite sets it off so that tiny test runs never pay a compile.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trnfrontier.runtime.data_home import data_home

COMPILE_ENV = "TRNF_COMPILE"
# Cache variables torch reads, each pointed at a folder under the data home when unset.
CACHE_ENVS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
AUTO_DEVICES = ("cpu", "cuda")
_OFF = {"0", "off", "false", "no"}
_ON = {"1", "on", "true", "yes"}


def compile_enabled(
    setting: bool | str, device_type: str, environ: Mapping[str, str] = os.environ
) -> bool:
    """The decision for a recipe's ``runtime.compile`` (true, false or "auto") on a device."""
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ValueError(f"runtime.compile={setting!r}: expected true, false or auto")
    forced = environ.get(COMPILE_ENV, "").strip().lower()
    if forced in _OFF:
        return False
    if forced in _ON:
        return True
    return device_type in AUTO_DEVICES


def compile_backend(device_type: str) -> str:
    return "neuron" if device_type == "neuron" else "inductor"


def use_cache_under_home(environ: dict[str, str] | None = None) -> Path:
    """Point torch's compile caches at ``<data home>/compile/...`` where the environment
    names none; returns the compile cache root. Must run before the first compile."""
    env = os.environ if environ is None else environ
    root = data_home(env) / "compile"
    for name, sub in CACHE_ENVS.items():
        if not env.get(name):
            env[name] = str(root / sub)
    return root


def compile_module(module: torch.nn.Module, device_type: str) -> Any:
    return torch.compile(module, backend=compile_backend(device_type), dynamic=False)


def compile_optimizers(optimizers: list[torch.optim.Optimizer], device_type: str) -> int:
    """Replace each optimizer's ``update_fn`` by a compiled copy; returns how many were."""
    count = 0
    for opt in optimizers:
        fn = getattr(opt, "update_fn", None)
        if fn is not None:
            opt.update_fn = torch.compile(fn, backend=compile_backend(device_type), dynamic=False)
            count += 1
    return count
