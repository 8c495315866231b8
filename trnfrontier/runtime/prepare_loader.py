"""Load the trusted prepare.py: the one module every score and every data byte comes from.

The runtime never hard-codes which prepare.py it uses. In order:
1. an explicit path (``load_prepare(path)``),
2. the ``TRNF_PREPARE`` environment variable (set by ``trnf --prepare PATH`` so that
   torchrun workers see the same file),
3. a plain ``import prepare`` (a submission: prepare.py sits beside train.py).

A path is loaded the way Python loads any module: its directory goes on ``sys.path`` and
``import prepare`` runs. This module never writes into ``sys.modules`` itself, because a
submission carries it and the organisers' screen rightly treats replacing the ``prepare``
module as tampering with the trusted contract.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

PREPARE_ENV = "TRNF_PREPARE"


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex SHA256 of a file, read in chunks (flat memory for multi-GB checkpoints)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk_size):
            digest.update(block)
    return digest.hexdigest()


def module_file(module: ModuleType) -> Path | None:
    """The resolved file a module was loaded from (None for namespace or built-in modules)."""
    filename = getattr(module, "__file__", None)
    return Path(filename).resolve() if filename else None


def load_prepare(path: str | os.PathLike[str] | None = None) -> ModuleType:
    """Return the trusted prepare module (see the module docstring for the search order).

    Raises ImportError when a *different* prepare.py is already imported in this process:
    one process, one trusted contract.
    """
    chosen = path if path is not None else os.environ.get(PREPARE_ENV)
    if chosen is None:
        return importlib.import_module("prepare")
    resolved = Path(chosen).expanduser().resolve()
    if not resolved.is_file():
        raise FileNotFoundError(f"trusted prepare.py not found at {resolved}")
    loaded = sys.modules.get("prepare")
    if loaded is not None:
        if module_file(loaded) == resolved:
            return loaded
        raise ImportError(
            f"a different prepare.py ({module_file(loaded)}) is already imported in this process, not {resolved}"
        )
    if resolved.name != "prepare.py":
        raise ImportError(f"{resolved}: the trusted contract is imported as `prepare`, so the file must be named prepare.py")
    directory = str(resolved.parent)
    # On sys.path only for this import, so a stray directory (a temp dir, a checkout)
    # never shadows other modules later in the process.
    sys.path.insert(0, directory)
    try:
        module = importlib.import_module("prepare")
    finally:
        sys.path.remove(directory)
    if module_file(module) != resolved:
        raise ImportError(f"`import prepare` found {module_file(module)} before {resolved}")
    return module
