"""The environment that changes a run's speed, as one record: what summary.json keeps
(``speed_env``), the ledger indexes and `trnf compare` names when two sides differ.

Two runs of one recipe can differ in tokens/s (and so, on a time budget, in steps and
score) for reasons the recipe does not show: compiler flags (a ``NEURON_CC_FLAGS``
without ``--optlevel`` ... halved one team's throughput), the logical core
configuration, the process count, the machine, a cold compile cache, another
torch-neuronx / neuronx-cc / nki. This module reads them without importing any of those
packages (package metadata only), so it is cheap, works where importing torch-neuronx
would fail, and `trnf doctor` uses the same readings.

Runtime layer: standard library only (a submission carries it).
"""

from __future__ import annotations

import os
import platform
import shlex
from importlib import metadata
from pathlib import Path
from typing import Any

# Distributions whose versions change speed (metadata names, not import names).
SPEED_PACKAGES = ("torch", "torch-neuronx", "neuronx-cc", "nki")
COMPILE_CACHE_ENV = "NEURON_COMPILE_CACHE_URL"
DEFAULT_COMPILE_CACHE = "/var/tmp/neuron-compile-cache"
# Flat keys of a speed record that two runs are compared on (``flat`` below), in the order
# a verdict names them.
COMPARED = (
    "NEURON_CC_FLAGS", "lnc", "world_size", "host", "device", "compile_cache",
    "versions.torch", "versions.torch-neuronx", "versions.neuronx-cc", "versions.nki",
)  # fmt: skip


def package_version(dist: str) -> str | None:
    """The installed version of a distribution, from its metadata (nothing is imported)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def compile_cache_url(env: dict[str, str]) -> str:
    """Where neuronx-cc caches compiled graphs: ``--cache_dir`` in NEURON_CC_FLAGS, else
    NEURON_COMPILE_CACHE_URL, else the default (the order of the Neuron docs' "Neuron
    Persistent Cache" page)."""
    try:
        words = shlex.split(env.get("NEURON_CC_FLAGS", ""))
    except ValueError:
        words = []
    for i, word in enumerate(words):
        if word.startswith("--cache_dir="):
            return word.split("=", 1)[1]
        if word == "--cache_dir" and i + 1 < len(words):
            return words[i + 1]
    return env.get(COMPILE_CACHE_ENV, DEFAULT_COMPILE_CACHE)


def cache_entries(location: str | None) -> int | None:
    """Entries at the top of a local cache folder (0 when it is missing); None for no
    cache or a remote one (a URL: not looked at)."""
    if location is None or "://" in location:
        return None
    try:
        with os.scandir(location) as entries:
            return sum(1 for _ in entries)
    except OSError:
        return 0


def cache_state(location: str | None) -> str:
    """``warm`` (a folder with entries), ``cold`` (missing or empty), ``remote`` (a URL:
    not looked at), ``none`` (no cache in use). Read before the run compiles anything."""
    if location is None:
        return "none"
    if "://" in location:
        return "remote"
    return "warm" if cache_entries(location) else "cold"


def capture(
    *,
    world_size: int,
    device: str | None,
    lnc: int | str | None = None,
    compile_cache: str | Path | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The speed record of a run starting now. ``compile_cache``: the cache this run uses
    (a CPU/CUDA run's torch.compile cache when it compiles; None when it compiles nothing);
    a Neuron run's is found from the environment."""
    source = dict(os.environ if env is None else env)
    if device == "neuron":
        compile_cache = compile_cache_url(source)
    location = None if compile_cache is None else str(compile_cache)
    chosen_lnc = lnc if lnc is not None else source.get("NEURON_LOGICAL_NC_CONFIG")
    return {
        "NEURON_CC_FLAGS": source.get("NEURON_CC_FLAGS") or None,
        "lnc": int(str(chosen_lnc)) if str(chosen_lnc or "").isdigit() else None,
        "world_size": int(world_size),
        "host": platform.node(),
        "device": device,
        "compile_cache": cache_state(location),
        "compile_cache_path": location,
        "compile_cache_entries": cache_entries(location),
        "versions": {name: package_version(name) for name in SPEED_PACKAGES},
    }


def flat(record: dict[str, Any] | None) -> dict[str, Any]:
    """``{"versions": {"nki": "0.6"}}`` -> ``{"versions.nki": "0.6"}``, only the keys in
    COMPARED (an empty dict for a run that recorded none)."""
    if not isinstance(record, dict):
        return {}
    found: dict[str, Any] = {}
    for key in COMPARED:
        head, _, tail = key.partition(".")
        value = record.get(head)
        if tail:
            value = value.get(tail) if isinstance(value, dict) else None
        found[key] = value
    return found
