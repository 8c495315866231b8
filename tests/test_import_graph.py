"""The package's import graph: no cycle, and nothing imports a layer above its own.

Built from the source with ``ast`` (every ``import``, lazy ones in function bodies too),
so it costs no import. The layers are docs/architecture.md's ("The import rule"); a new
top-level module or subpackage must be given one here and there.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trnfrontier"

# Bottom to top. A unit (a subpackage, or a module directly under trnfrontier/) may import
# units of its own layer or below, never above; and the graph of units has no cycle.
LAYERS: tuple[frozenset[str], ...] = (
    # what a submission carries: imports nothing of the tool (tests/runtime/test_layering.py)
    frozenset({"runtime"}),
    # what everything shares: errors and output, processes, the trusted prepare.py, the
    # organisers' rules, the archive format
    frozenset({"errors", "console", "progress", "processes", "hints", "trusted_prepare",
               "child_env", "contract", "submission", "plots", "stats"}),
    # what the command libraries build on: recipes, and where untrusted code runs
    frozenset({"recipes", "untrusted"}),
    # one library per command
    frozenset({"data_prep", "train", "evaluate", "kit", "profiling", "doctor", "ledger"}),
    # libraries that drive other libraries: the gate runs the kit harness, packaging screens
    # with the gate and scores with evaluate, a sweep trains and records
    frozenset({"verify"}),
    frozenset({"packaging", "sweep"}),
    # the command line
    frozenset({"cli", "__main__"}),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "_shipped" not in p.parts}


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The trnfrontier modules module ``name`` (at ``path``) imports: ``from pkg import mod``
    names the module ``pkg.mod``, ``from pkg import name`` the package (whose ``__init__``
    must define it); a relative ``from ..pkg import mod`` is resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (base := _absolute(package, node.level, node.module)):
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {module for module in found if module in known and module != "trnfrontier"}


def _absolute(package: str, level: int, module: str | None) -> str:
    """The module a ``from`` import names: ``module`` itself when absolute, else resolved
    ``level`` packages up from ``package`` (``""`` when it climbs above the top)."""
    if level == 0:
        return module or ""
    parts = package.split(".")
    if level > len(parts):
        return ""
    base = ".".join(parts[: len(parts) - level + 1])
    return f"{base}.{module}" if module else base


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) - {name} for name, path in known.items()}


def _unit(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_relative_imports_are_seen(tmp_path: Path) -> None:
    # A cross-package ``from ..x import y`` must count like its absolute spelling, or an
    # upward import written relatively would pass the layer rule unseen.
    known = _modules()
    source = tmp_path / "build.py"
    source.write_text("from ..runtime import recipe\nfrom . import flatten\nfrom .trainpy import uses_kernels\n")
    assert _imports("trnfrontier.packaging.build", source, known) == {
        "trnfrontier.runtime.recipe", "trnfrontier.packaging.flatten", "trnfrontier.packaging.trainpy",
    }
    package_init = tmp_path / "__init__.py"
    package_init.write_text("from .report import Check\nfrom ..cli import app\nfrom .. import __version__\n")
    assert _imports("trnfrontier.verify", package_init, known) == {"trnfrontier.verify.report", "trnfrontier.cli.app"}


def test_no_module_imports_itself_back() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_cycle_between_packages() -> None:
    units: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        units.setdefault(_unit(module), set()).update(_unit(t) for t in targets if _unit(t) != _unit(module))
    cycle = _cycle(units)
    assert cycle is None, "packages import each other: " + " -> ".join(cycle or [])


def test_every_package_has_a_layer() -> None:
    layered = set().union(*LAYERS)
    units = {_unit(m) for m in _modules() if m != "trnfrontier"}
    assert not units - layered, f"give {sorted(units - layered)} a layer in LAYERS and docs/architecture.md"


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_nothing_imports_a_layer_above(layer: int) -> None:
    level = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if level.get(_unit(module)) == layer
        for target in targets
        if level.get(_unit(target), -1) > layer
    )
    assert not upward, "imports running up a layer:\n" + "\n".join(upward)
