"""Load the trusted prepare.py: the one module every score and every data byte comes from.

The runtime never hard-codes which prepare.py it uses. In order:
1. an explicit path (``load_prepare(path)``),
2. the ``TRNF_PREPARE`` environment variable (set by ``trnf --prepare PATH`` so that
   torchrun workers see the same file),
3. a plain ``import prepare`` (a submission: prepare.py sits beside train.py).

Whatever is loaded is registered as ``sys.modules["prepare"]`` so that ``import prepare``
anywhere later in the process gets the same module object.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
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


def load_prepare(path: str | os.PathLike[str] | None = None) -> ModuleType:
    """Return the trusted prepare module (see the module docstring for the search order)."""
    chosen = path if path is not None else os.environ.get(PREPARE_ENV)
    if chosen is None:
        return importlib.import_module("prepare")
    resolved = Path(chosen).expanduser().resolve()
    loaded = sys.modules.get("prepare")
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == resolved:
        return loaded
    if not resolved.is_file():
        raise FileNotFoundError(f"trusted prepare.py not found at {resolved}")
    spec = importlib.util.spec_from_file_location("prepare", resolved)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {resolved} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["prepare"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("prepare", None)
        raise
    return module


def prepare_path(module: ModuleType) -> Path:
    """The file a loaded prepare module came from."""
    return Path(module.__file__).resolve()  # type: ignore[arg-type]
