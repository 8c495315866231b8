"""The runtime layer is what a submission carries: it must import nothing of the tool."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trnfrontier.runtime
from trnfrontier.contract.allowed_imports import RUNTIME_PACKAGES

RUNTIME_DIR = Path(trnfrontier.runtime.__file__).parent
TOOL_PACKAGES = {"typer", "rich", "pydantic", "yaml", "click"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_runtime_imports_only_stdlib_torch_numpy_and_prepare() -> None:
    offenders = []
    for path in sorted(RUNTIME_DIR.rglob("*.py")):
        for lineno, name in _imports(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in RUNTIME_PACKAGES:
                continue
            if name.startswith("trnfrontier.runtime"):
                continue
            offenders.append(f"{path.relative_to(RUNTIME_DIR.parent.parent)}:{lineno} imports {name}")
    assert not offenders, "runtime layer imports outside its allowance:\n" + "\n".join(offenders)


def test_importing_the_runtime_loads_no_tool_package() -> None:
    """Import every runtime module in a fresh interpreter and check sys.modules."""
    modules = sorted(
        "trnfrontier.runtime." + ".".join(p.relative_to(RUNTIME_DIR).with_suffix("").parts)
        for p in RUNTIME_DIR.rglob("*.py")
        if p.name != "__init__.py" and p.name != "__main__.py"
    )
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"print(sorted(set(m.split('.')[0] for m in sys.modules) & set({sorted(TOOL_PACKAGES)!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"tool packages loaded by the runtime: {result.stdout}"


def test_the_runtime_passes_the_submission_screen_imports() -> None:
    """The runtime is shipped in submissions: what it may import, the screen must accept
    (one allow-list, trnfrontier.contract.allowed_imports, for both)."""
    from trnfrontier.verify.screen import screen_source

    flagged = []
    for path in sorted(RUNTIME_DIR.rglob("*.py")):
        result = screen_source(path.read_text(encoding="utf-8"), path.name, {"trnfrontier"})
        flagged += [str(f) for f in result.findings if " imports " in f" {f.what}"]
    assert not flagged, "runtime imports the submission screen rejects:\n" + "\n".join(flagged)
