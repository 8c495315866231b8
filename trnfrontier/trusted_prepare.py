"""Which trusted prepare.py the tool uses, and its fingerprint.

The project's own prepare.py is the default; ``trnf --prepare PATH`` or ``TRNF_PREPARE``
points trnf at another one (the organisers' copy, say). Its SHA256 goes beside every
score the tool prints.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from trnfrontier.errors import TrnfError
from trnfrontier.runtime.prepare_loader import PREPARE_ENV, load_prepare, module_file, sha256_file

_PACKAGE_DIR = Path(__file__).resolve().parent


# Where a wheel carries the repository-root files (pyproject.toml: force-include).
SHIPPED_DIR = _PACKAGE_DIR / "_shipped"


def project_root_file(name: str) -> Path | None:
    """A file that ships at the repository root (prepare.py, kernels/, recipes/; .git).

    In a clone (an editable install, the README's set-up) it sits beside the package
    directory; an installed wheel carries prepare.py, recipes/ and kernels/ inside the
    package, under ``_shipped/``.
    """
    for candidate in (_PACKAGE_DIR.parent / name, SHIPPED_DIR / name):
        if candidate.exists():
            return candidate
    return None


def default_prepare_path() -> Path:
    found = project_root_file("prepare.py")
    if found is None:
        raise TrnfError("the project's prepare.py is missing from this installation; reinstall trnf or pass --prepare PATH")
    return found


def selected_prepare_path() -> Path:
    """The prepare.py this process uses: ``TRNF_PREPARE`` if set, else the project's."""
    chosen = os.environ.get(PREPARE_ENV)
    if chosen:
        path = Path(chosen).expanduser().resolve()
        if not path.is_file():
            raise TrnfError(f"--prepare / {PREPARE_ENV} points at {path}, which is not a file; give the path of a prepare.py")
        return path
    return default_prepare_path()


@dataclass(frozen=True)
class TrustedContract:
    """A loaded prepare.py and its fingerprint."""

    module: ModuleType
    path: Path
    sha256: str


def load_contract() -> TrustedContract:
    """Load the selected prepare.py (once per process) with its SHA256."""
    path = selected_prepare_path()
    loaded = sys.modules.get("prepare")
    if loaded is not None and module_file(loaded) != path:
        # The tool (unlike a submission's runtime) may switch contracts within one process,
        # e.g. `trnf --prepare OTHER` after the project's prepare.py was imported.
        del sys.modules["prepare"]
    try:
        module = load_prepare(path)
    except SyntaxError as exc:
        raise TrnfError(f"{path} does not parse ({exc.msg}, line {exc.lineno}); point --prepare at a valid prepare.py") from None
    except ImportError as exc:
        raise TrnfError(f"{path} cannot be imported: {exc}") from None
    return TrustedContract(module=module, path=path, sha256=sha256_file(path))


def tokenizer_artifact(prepare_path: Path) -> Path | None:
    """The tokenizer artifact shipped beside a prepare.py (the organisers ship theirs,
    SHA256-pinned, in ``artifacts/``): ``artifacts/tokenizer*.zip`` when there is exactly one."""
    found = sorted((prepare_path.parent / "artifacts").glob("tokenizer*.zip"))
    return found[0] if len(found) == 1 else None


def tokenizer_sha256_of(prepare_path: Path) -> tuple[str | None, str]:
    """(SHA256, where it came from) of the tokenizer the prepare.py at ``prepare_path`` uses:
    its shipped artifact when it has one (the organisers' kit), else None with the reason
    (the project's prepare.py trains one per dataset: the caller asks the dataset)."""
    artifact = tokenizer_artifact(prepare_path)
    if artifact is None:
        return None, f"no artifacts/tokenizer*.zip beside {prepare_path}"
    return sha256_file(artifact), f"SHA256 of {artifact}"


def recorded_tokenizer_sha256(contract: TrustedContract) -> str | None:
    """The tokenizer SHA256 a run under ``contract`` records: the prepare.py's own
    ``tokenizer_sha256()`` when it offers one (the project's: the active dataset's pin,
    which is the shipped artifact's SHA256 unless that dataset trained a tokenizer of its
    own), else the SHA256 of the artifact shipped beside it (the organisers' kit), else None."""
    own = getattr(contract.module, "tokenizer_sha256", None)
    if callable(own):
        try:
            return str(own())
        except Exception:  # noqa: BLE001 - no prepared data here: fall back to the artifact
            pass
    return tokenizer_sha256_of(contract.path)[0]
