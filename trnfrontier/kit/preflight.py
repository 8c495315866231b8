"""Checks on a team's train.py before any process starts: it exists, parses, defines
``load_for_eval``, and will import the trusted prepare.py.

These cost milliseconds and each saves a launch (on the chip, minutes of compilation)
that would fail anyway.
"""

from __future__ import annotations

import ast
from pathlib import Path

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.runtime.prepare_loader import sha256_file


def _defined_names(tree: ast.Module) -> set[str]:
    """Names bound at module level: defs, classes, assignments and imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def check_train_py(path: Path) -> ast.Module:
    """The parsed train.py; a missing file, a syntax error or no ``load_for_eval`` is one clear error."""
    if not path.exists():
        raise UsageError(f"--train-py {path}: no such file")
    if not path.is_file():
        raise UsageError(f"--train-py {path}: not a file; give the path of a train.py")
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except SyntaxError as exc:
        raise TrnfError(f"{path}:{exc.lineno}: syntax error: {exc.msg}; nothing was launched") from None
    except ValueError as exc:  # null bytes
        raise TrnfError(f"{path}: not Python source ({exc}); nothing was launched") from None
    if "load_for_eval" not in _defined_names(tree):
        raise TrnfError(
            f"{path} defines no load_for_eval(checkpoint_path, device), which the scorer calls to load the "
            "checkpoint; add it before training (nothing was launched)"
        )
    return tree


def calls_record_step_boundary(tree: ast.Module) -> bool:
    """Whether the source mentions record_step_boundary at all (a hint, not a proof)."""
    return any(
        (isinstance(node, ast.Name) and node.id == "record_step_boundary")
        or (isinstance(node, ast.Attribute) and node.attr == "record_step_boundary")
        or (isinstance(node, ast.alias) and node.name == "record_step_boundary")
        for node in ast.walk(tree)
    )


def check_prepare_beside(script: Path, trusted: Path, trusted_sha256: str) -> None:
    """A prepare.py beside train.py shadows any other (Python puts the script's directory
    first on sys.path), so it must be the trusted one, byte for byte."""
    beside = script.parent / "prepare.py"
    if beside.is_file() and beside.resolve() != trusted.resolve() and sha256_file(beside) != trusted_sha256:
        raise TrnfError(
            f"{beside} differs from the trusted prepare.py ({trusted}) and train.py would import it; "
            f"remove it, or make it the trusted one with `trnf --prepare {beside} train ...`"
        )
