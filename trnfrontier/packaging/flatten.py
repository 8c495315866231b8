"""Inline a package's modules into one Python module, for a single-file train.py.

``flatten(package_dir, package, roots)`` takes the modules ``roots`` need (their imports
inside ``package``, transitively), orders them so every module comes after the ones it
imports, and splices their source into one text:

- imports of other modules are hoisted (deduplicated) to the top; imports inside
  ``package`` are removed, because every name now lives in one namespace
  (``from package.model import GPT as G`` becomes ``G = GPT``);
- a module imported as a namespace (``from trnfrontier.runtime import ops`` then
  ``ops.rms_norm(x)``) has its attribute uses rewritten to the bare name (``rms_norm(x)``);
- docstrings become comments; ``__all__`` and ``if __name__ == "__main__"`` blocks go.

Nothing is executed from a string: the output is plain source that static screens can read.
One namespace means two modules must not define the same name: any collision (between
modules, with a hoisted import, or with the names the caller reserves) is a
FlattenError naming both definitions, never a silent shadowing. So is anything that
cannot be rewritten faithfully: assigning a module attribute (``muon.x = ...``),
passing a module around as a value, or a relative import that leaves the package.
A module the caller knows its code never imports (``omit``, e.g. the NKI kernel dispatch
of a recipe without kernels) may be left out where it is imported lazily; that import
then raises ImportError saying why.

Edits are made on the UTF-8 bytes at the AST's positions, so comments and layout of the
untouched code survive.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from trnfrontier.errors import TrnfError

# typing's aliases of collections.abc classes are the same thing to a reader and, under
# `from __future__ import annotations`, never evaluated: importing both is not a collision.
_EQUIVALENT = {
    f"typing.{n}": f"collections.abc.{n}"
    for n in ("Callable", "Iterable", "Iterator", "Mapping", "Sequence", "Generator")
}


class FlattenError(TrnfError):
    """The modules cannot be merged into one namespace faithfully."""


@dataclass
class _Module:
    name: str  # dotted, relative to the package ("model", "kernels.select")
    path: Path
    source: bytes
    tree: ast.Module
    is_package: bool
    deps: set[str] = field(default_factory=set)
    aliases: dict[str, str] = field(default_factory=dict)  # local name -> module it stands for
    edits: list[tuple[int, int, bytes]] = field(default_factory=list)
    hoisted: list[tuple[str, str, str]] = field(
        default_factory=list
    )  # (bound name, canonical, statement)
    defined: dict[str, int] = field(default_factory=dict)  # top-level name -> line
    line_starts: list[int] = field(default_factory=list)  # byte offset of each line


@dataclass(frozen=True)
class Flattened:
    source: str
    modules: tuple[str, ...]  # dependency order, as paths relative to the package directory


def _canonical(name: str) -> str:
    return _EQUIVALENT.get(name, name)


class _Flattener:
    def __init__(self, package_dir: Path, package: str, omit: dict[str, str] | None = None) -> None:
        self.dir = Path(package_dir)
        self.package = package
        self.modules: dict[str, _Module] = {}
        self.omit = dict(omit or {})  # module (or subpackage) left out -> why

    # ------------------------------------------------------------------ finding modules

    def _file(self, name: str) -> tuple[Path, bool] | None:
        base = self.dir.joinpath(*name.split(".")) if name else self.dir
        if base.with_suffix(".py").is_file() and name:
            return base.with_suffix(".py"), False
        if (base / "__init__.py").is_file():
            return base / "__init__.py", True
        return None

    def load(self, name: str) -> _Module:
        if name in self.modules:
            return self.modules[name]
        found = self._file(name)
        if found is None:
            raise FlattenError(f"{self.package}.{name} has no source file under {self.dir}")
        path, is_package = found
        source = path.read_bytes()
        try:
            tree = ast.parse(source, filename=str(path))
        except SyntaxError as exc:
            raise FlattenError(f"{path}:{exc.lineno}: does not parse ({exc.msg})") from None
        module = _Module(name, path, source, tree, is_package, line_starts=_line_starts(source))
        self.modules[name] = module
        self._analyse(module)
        for dep in sorted(module.deps):
            self.load(dep)
        return module

    def _where(self, module: _Module, node: ast.AST) -> str:
        return f"{self.package.replace('.', '/')}/{module.path.relative_to(self.dir)}:{getattr(node, 'lineno', 0)}"

    def _target(self, module: _Module, node: ast.ImportFrom) -> str | None:
        """The package-relative module an ImportFrom names, or None when it is outside the package."""
        if node.level == 0:
            mod = node.module or ""
            if mod == self.package:
                return ""
            if mod.startswith(self.package + "."):
                return mod[len(self.package) + 1 :]
            return None
        parts = module.name.split(".") if module.name else []
        if not module.is_package:
            parts = parts[:-1]
        if node.level - 1 > len(parts):
            raise FlattenError(
                f"{self._where(module, node)}: relative import leaves {self.package}"
            )
        base = parts[: len(parts) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def _is_module(self, name: str) -> bool:
        return self._file(name) is not None

    # ------------------------------------------------------------------ one module

    def _span(self, module: _Module, node: ast.AST) -> tuple[int, int]:
        starts = module.line_starts
        first, column = node.lineno, node.col_offset  # type: ignore[attr-defined]
        last, end_column = node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]
        return starts[first - 1] + column, starts[last - 1] + end_column

    def _replace(self, module: _Module, node: ast.AST, text: str) -> None:
        start, end = self._span(module, node)
        module.edits.append((start, end, text.encode("utf-8")))

    def _remove_lines(self, module: _Module, node: ast.stmt, text: str = "") -> None:
        """Drop whole lines of a top-level statement (its decorators/comments stay)."""
        starts = module.line_starts
        start = starts[node.lineno - 1]
        last = node.end_lineno or node.lineno
        end = starts[last] if last < len(starts) else len(module.source)
        module.edits.append((start, end, text.encode("utf-8")))

    def _omitted(self, module: _Module, node: ast.Import | ast.ImportFrom) -> str | None:
        """Why an import reaches a module left out (None when it reaches none)."""
        if isinstance(node, ast.ImportFrom):
            target = self._target(module, node)
            targets = (
                []
                if target is None
                else [target] + [f"{target}.{a.name}".lstrip(".") for a in node.names]
            )
        else:
            prefix = self.package + "."
            targets = [a.name[len(prefix) :] for a in node.names if a.name.startswith(prefix)]
        for name in targets:
            for omitted, why in self.omit.items():
                if name == omitted or name.startswith(omitted + "."):
                    return why
        return None

    def _intra_import(self, module: _Module, node: ast.stmt) -> list[tuple[str, str]] | None:
        """For an import inside the package: [(local name, name in the merged namespace)]
        for plain names (module aliases are recorded); None for an outside import."""
        pairs: list[tuple[str, str]] = []
        if isinstance(node, ast.ImportFrom):
            target = self._target(module, node)
            if target is None:
                return None
            for alias in node.names:
                if alias.name == "*":
                    raise FlattenError(
                        f"{self._where(module, node)}: `import *` from {self.package} cannot be flattened"
                    )
                local = alias.asname or alias.name
                sub = f"{target}.{alias.name}" if target else alias.name
                if self._is_module(sub):
                    self._alias(module, node, local, sub)
                else:
                    module.deps.add(target)
                    if local != alias.name:
                        pairs.append((local, alias.name))
            return pairs
        assert isinstance(node, ast.Import)
        inside = [
            a for a in node.names if a.name == self.package or a.name.startswith(self.package + ".")
        ]
        if not inside:
            return None
        if len(inside) != len(node.names):
            raise FlattenError(
                f"{self._where(module, node)}: mixes {self.package} and other imports in one statement"
            )
        for alias in inside:
            if alias.asname is None:
                raise FlattenError(
                    f"{self._where(module, node)}: `import {alias.name}` without `as` cannot be flattened"
                )
            self._alias(module, node, alias.asname, alias.name[len(self.package) + 1 :])
        return pairs

    def _alias(self, module: _Module, node: ast.AST, local: str, target: str) -> None:
        known = module.aliases.get(local)
        if known is not None and known != target:
            raise FlattenError(
                f"{self._where(module, node)}: {local!r} stands for both {known} and {target}"
            )
        module.aliases[local] = target
        module.deps.add(target)

    def _analyse(self, module: _Module) -> None:
        body = module.tree.body
        for index, node in enumerate(body):
            if (
                index == 0
                and isinstance(node, ast.Expr)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                self._remove_lines(module, node, _as_comment(node.value.value))
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                self._remove_lines(module, node)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if self._omitted(module, node) is not None:
                    raise FlattenError(
                        f"{self._where(module, node)}: imports a module left out of the single file at module level; "
                        "it can only be left out where it is imported lazily (inside a function)"
                    )
                pairs = self._intra_import(module, node)
                if pairs is None:
                    self._hoist(module, node)
                    self._remove_lines(module, node)
                else:
                    self._remove_lines(
                        module, node, "".join(f"{local} = {name}\n" for local, name in pairs)
                    )
                    for local, _ in pairs:
                        module.defined.setdefault(local, node.lineno)
                continue
            if _is_dunder_all(node) or _is_main_block(node):
                self._remove_lines(module, node)
                continue
            for name in _bound_names(node):
                module.defined.setdefault(name, node.lineno)
        top = {id(node) for node in body}
        for inner in ast.walk(module.tree):
            if isinstance(inner, ast.Global):
                for name in inner.names:
                    module.defined.setdefault(name, inner.lineno)
            if id(inner) in top:
                continue
            if isinstance(inner, (ast.Import, ast.ImportFrom)) and not (
                isinstance(inner, ast.ImportFrom) and inner.module == "__future__"
            ):
                why = self._omitted(module, inner)
                if why is not None:  # never reached by the code paths the single file serves
                    self._replace(module, inner, f"raise ImportError({why!r})")
                    continue
                pairs = self._intra_import(module, inner)
                if pairs is not None:
                    self._replace(
                        module,
                        inner,
                        "; ".join(f"{local} = {name}" for local, name in pairs) or "pass",
                    )

    def _hoist(self, module: _Module, node: ast.Import | ast.ImportFrom) -> None:
        statement = ast.unparse(node)
        for alias in node.names:
            if isinstance(node, ast.Import):
                bound = alias.asname or alias.name.split(".")[0]
                canonical = alias.name if alias.asname else alias.name.split(".")[0]
            else:
                bound = alias.asname or alias.name
                canonical = f"{'.' * node.level}{node.module or ''}.{alias.name}"
            module.hoisted.append((bound, _canonical(canonical), statement))

    def rewrite_attributes(self, module: _Module) -> None:
        """``alias.name`` -> ``name`` for every module alias; anything else using the alias is an error."""
        if not module.aliases:
            return
        bases: set[int] = set()
        for node in ast.walk(module.tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in module.aliases
            ):
                target = self.modules[module.aliases[node.value.id]]
                bases.add(id(node.value))
                if not isinstance(node.ctx, ast.Load):
                    raise FlattenError(
                        f"{self._where(module, node)}: assigns {node.value.id}.{node.attr} (a module attribute); "
                        "one merged namespace cannot express that"
                    )
                if node.attr not in target.defined:
                    raise FlattenError(
                        f"{self._where(module, node)}: {node.value.id}.{node.attr} is not a top-level name of {target.name}"
                    )
                self._replace(module, node, node.attr)
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Name) and node.id in module.aliases and id(node) not in bases:
                raise FlattenError(
                    f"{self._where(module, node)}: uses module {node.id!r} as a value, which a single file cannot keep"
                )
            if isinstance(node, ast.arg) and node.arg in module.aliases:
                raise FlattenError(
                    f"{self._where(module, node)}: parameter {node.arg!r} shadows the module of that name"
                )

    def emitted(self, module: _Module) -> str:
        data = module.source
        for start, end, replacement in sorted(module.edits, key=lambda e: (e[0], e[1]), reverse=True):
            data = data[:start] + replacement + data[end:]
        text = re.sub(
            r"\n{4,}", "\n\n\n", data.decode("utf-8")
        )  # removed lines leave runs of blanks
        return text.strip("\n") + "\n"


def _line_starts(source: bytes) -> list[int]:
    starts = [0]
    for index, byte in enumerate(source):
        if byte == 0x0A:
            starts.append(index + 1)
    return starts


def _as_comment(text: str) -> str:
    return "".join(f"# {line}".rstrip() + "\n" for line in text.strip().splitlines())


def _is_dunder_all(node: ast.stmt) -> bool:
    return isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and any(
        isinstance(t, ast.Name) and t.id == "__all__"
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
    )


def _is_main_block(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    names = [n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)]
    return names == ["__name__"]


def _bound_names(node: ast.stmt) -> list[str]:
    """Names a top-level statement binds in the module namespace (not inside defs/classes)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [a.asname or a.name.split(".")[0] for a in node.names]
    names: list[str] = []
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    elif isinstance(node, (ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    for target in targets:
        names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    for child in ast.iter_child_nodes(node):  # if/try/with/for bodies still bind module names
        if isinstance(child, ast.stmt):
            names += _bound_names(child)
        elif isinstance(child, ast.ExceptHandler):
            names += [child.name] if child.name else []
            for stmt in child.body:
                names += _bound_names(stmt)
    return names


def _order(modules: dict[str, _Module], roots: list[str]) -> list[str]:
    """Dependencies first (depth-first, names sorted for a stable result); a cycle is an error."""
    done: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            raise FlattenError(
                f"import cycle between runtime modules: {' -> '.join(chain + [name])}"
            )
        state[name] = "active"
        for dep in sorted(modules[name].deps - {name}):
            visit(dep, chain + [name])
        state[name] = "done"
        done.append(name)

    for root in roots:
        visit(root, [])
    return done


def module_closure(package_dir: Path, package: str, roots: list[str]) -> list[Path]:
    """The source files of ``roots`` and every package module they import, dependency order."""
    flattener = _Flattener(package_dir, package)
    for root in roots:
        flattener.load(root)
    return [flattener.modules[name].path for name in _order(flattener.modules, roots)]


def flatten(
    package_dir: Path,
    package: str,
    roots: list[str],
    reserved: dict[str, str] | None = None,
    omit: dict[str, str] | None = None,
) -> Flattened:
    """Merge ``roots`` and the package modules they import into one module's source.

    ``reserved`` maps names the caller will define after the merged code to a description
    (for the collision message). ``omit`` maps modules (or subpackages) to leave out to
    why: they may only be imported inside functions, and each such import becomes
    ``raise ImportError(why)`` (a path the caller knows its code never takes).
    """
    flattener = _Flattener(package_dir, package, omit)
    for root in roots:
        flattener.load(root)
    order = _order(flattener.modules, roots)
    owners: dict[str, str] = {
        name: f"the generated train.py ({what})" for name, what in (reserved or {}).items()
    }
    imports: dict[str, tuple[str, str]] = {}  # bound name -> (canonical, where)
    statements: list[str] = []
    for name in order:
        module = flattener.modules[name]
        rel = str(module.path.relative_to(flattener.dir))
        for bound, canonical, statement in module.hoisted:
            seen = imports.get(bound)
            if seen is not None and seen[0] != canonical:
                raise FlattenError(
                    f"name collision: {bound!r} is {seen[0]} in {seen[1]} but {canonical} in {rel}"
                )
            imports.setdefault(bound, (canonical, rel))
            if statement not in statements:
                statements.append(statement)
        for defined, line in sorted(module.defined.items()):
            where = f"{rel}:{line}"
            if defined in owners and owners[defined] != where:
                raise FlattenError(
                    f"name collision: {defined!r} is defined in {owners[defined]} and in {where}; rename one"
                )
            owners[defined] = where
    for bound, (canonical, rel) in imports.items():
        if bound in owners:
            raise FlattenError(
                f"name collision: {bound!r} is imported ({canonical}) in {rel} and defined in {owners[bound]}"
            )
    for name in order:
        flattener.rewrite_attributes(flattener.modules[name])
    parts = ["from __future__ import annotations\n", "\n".join(statements) + "\n"]
    for name in order:
        module = flattener.modules[name]
        rel = str(module.path.relative_to(flattener.dir))
        parts.append(
            f"\n# {'-' * 20} {package.replace('.', '/')}/{rel} {'-' * 20}\n\n"
            + flattener.emitted(module)
        )
    paths = tuple(str(flattener.modules[n].path.relative_to(flattener.dir)) for n in order)
    return Flattened(source="".join(parts), modules=paths)
