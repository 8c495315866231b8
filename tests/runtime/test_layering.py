"""The runtime layer is what a submission carries: it must import nothing of the tool."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trnfrontier.runtime

RUNTIME_DIR = Path(trnfrontier.runtime.__file__).parent
TOOL_PACKAGES = {"typer", "rich", "pydantic", "yaml", "click"}
ALLOWED_THIRD_PARTY = {"torch", "numpy", "prepare", "torch_neuronx", "nki", "neuronxcc", "torch_xla", "safetensors"}


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
            if top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY:
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
