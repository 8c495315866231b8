"""The static screen's second pass: the known ways of hiding code or imports from a name-based screen.

The screen is a fast first filter, never the boundary (the sandbox is), but each family
below once got a hostile archive past it, and each is cheap to spot in the AST:

- a computed attribute of ``builtins`` / ``__builtins__`` (``getattr(builtins, 'ev' + 'al')``),
  its namespace (``builtins.__dict__[...]``, ``vars(builtins)``), or the name ``__builtins__``;
- importers under another name (``from importlib import import_module as f``,
  ``importlib.__import__``, ``builtins.__import__``) called with a computed module name;
- process calls through ``posix`` / ``nt`` / ``_posixsubprocess`` (``posix.system``);
- deserialising code: ``pickle`` / ``marshal`` / ``shelve`` / ``dill`` loads;
- building functions from code: the ``compile`` builtin, ``types.FunctionType`` /
  ``CodeType``, ``__code__`` / ``__globals__`` / ``__subclasses__`` / frame internals;
- running another file as code: ``runpy``, the file loaders (``SourceFileLoader`` ...),
  ``spec_from_file_location`` with an explicit loader or a literal name that is not ``.py``.

What it leaves alone on purpose: ``getattr(obj, name)`` on ordinary objects, ``torch.compile``
and ``re.compile`` (attributes, not the builtin), ``importlib.import_module("literal")``
(screened as an import), and the trusted ``evaluate_bpb`` called in process, as the kit's
baseline train.py does after saving.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

_BUILTINS = frozenset({"builtins", "__builtin__"})
_IMPORTERS = frozenset({"import_module", "__import__"})
_PROCESS_MODULES = frozenset({"posix", "nt", "_posixsubprocess", "_winapi", "multiprocessing", "pty", "runpy", "code", "codeop"})
_PROCESS_CALLS = frozenset({"system", "popen", "fork", "forkpty", "fork_exec", "posix_spawn", "posix_spawnp", "execv", "execve",
                            "spawnv", "spawnve", "startfile", "CreateProcess"})
_DESERIALISERS = frozenset({"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"})
_CODE_BUILDERS = frozenset({"FunctionType", "CodeType", "LambdaType"})
_INTERNALS = frozenset({"__code__", "__globals__", "__subclasses__", "__builtins__", "__closure__", "f_globals", "f_locals",
                        "f_back", "f_builtins", "gi_frame", "tb_frame", "co_code", "_getframe", "__loader__"})
_FILE_LOADERS = frozenset({"SourceFileLoader", "SourcelessFileLoader", "ExtensionFileLoader", "spec_from_loader",
                           "run_path", "run_module"})


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class _Aliases:
    """Which local names stand for builtins, importers, process modules and deserialisers."""

    def __init__(self, tree: ast.Module) -> None:
        self.builtins: set[str] = set()
        self.importers: set[str] = set()
        self.process: set[str] = set()
        self.deserialisers: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top, bound = alias.name.split(".")[0], alias.asname or alias.name.split(".")[0]
                    self._bind(top, bound)
            elif isinstance(node, ast.ImportFrom) and node.module:
                top = node.module.split(".")[0]
                for alias in node.names:
                    bound = alias.asname or alias.name
                    if alias.name in _IMPORTERS:
                        self.importers.add(bound)
                    if top in _DESERIALISERS and alias.name in ("loads", "load", "Unpickler", "open"):
                        self.deserialisers.add(bound)
                    if top in _PROCESS_MODULES and alias.name in _PROCESS_CALLS:
                        self.process.add(bound)

    def _bind(self, top: str, bound: str) -> None:
        if top in _BUILTINS:
            self.builtins.add(bound)
        elif top in _PROCESS_MODULES:
            self.process.add(bound)
        elif top in _DESERIALISERS:
            self.deserialisers.add(bound)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _call_findings(node: ast.Call, names: _Aliases) -> Iterator[tuple[int, str]]:
    func, line = node.func, node.lineno
    first = node.args[0] if node.args else None
    if isinstance(func, ast.Name):
        if func.id in ("getattr", "setattr", "hasattr", "delattr") and first is not None and _root_name(first) in names.builtins | {"__builtins__"}:
            yield line, f"{func.id}() on builtins (a builtin reached by a computed name)"
        if func.id == "vars" and first is not None and _root_name(first) in names.builtins:
            yield line, "vars(builtins) (the builtins namespace)"
        if func.id == "compile":
            yield line, "calls compile() (builds code the screen cannot see)"
        if func.id in names.importers and _literal(first) is None:
            yield line, f"calls {func.id}() (an importer under another name) with a computed module name"
        if func.id in names.deserialisers:
            yield line, f"calls {func.id}() from a deserialiser (unpickling can run code)"
        if func.id in names.process:
            yield line, f"calls {func.id}() (process use is not allowed)"
        if func.id in _CODE_BUILDERS:
            yield line, f"calls {func.id}() (builds a function from a code object)"
        if func.id in _FILE_LOADERS:
            yield line, f"calls {func.id}() (runs a file as code; only the archive's .py files are screened)"
    elif isinstance(func, ast.Attribute):
        root = _root_name(func)
        if func.attr in _IMPORTERS and root in names.builtins | {"importlib"} and _literal(first) is None:
            yield line, f"calls {root}.{func.attr}() with a computed module name"
        if root in names.process and func.attr in _PROCESS_CALLS:
            yield line, f"calls {root}.{func.attr} (process use is not allowed)"
        if root in names.deserialisers and func.attr in ("loads", "load", "Unpickler", "open"):
            yield line, f"calls {root}.{func.attr} (deserialising can run code)"
        if func.attr in _CODE_BUILDERS:
            yield line, f"calls {func.attr}() (builds a function from a code object)"
        if func.attr in _FILE_LOADERS:
            yield line, f"calls {func.attr}() (runs a file as code; only the archive's .py files are screened)"
        if func.attr == "spec_from_file_location":
            # Without an explicit loader only .py (and .pyc) files get one; a literal other name is a smuggled file.
            path = _literal(node.args[1]) if len(node.args) > 1 else None
            if any(k.arg in ("loader", "submodule_search_locations") for k in node.keywords) or (path is not None and not path.endswith(".py")):
                yield line, "spec_from_file_location() with an explicit loader or a non-.py file (runs a file the screen cannot see)"


def bypass_findings(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) for every construct of the families in the module docstring."""
    names = _Aliases(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found.extend(_call_findings(node, names))
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            found.append((node.lineno, "uses __builtins__ (the builtins namespace)"))
        elif isinstance(node, ast.Attribute):
            if node.attr in _INTERNALS:
                found.append((node.lineno, f"reaches into interpreter internals (.{node.attr})"))
            elif node.attr == "__dict__" and _root_name(node) in names.builtins:
                found.append((node.lineno, "builtins.__dict__ (the builtins namespace)"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                top = module.split(".")[0]
                if top in ("runpy", "code", "codeop", "_posixsubprocess", "marshal"):
                    found.append((node.lineno, f"imports {module} (runs or builds code the screen cannot see)"))
    return sorted(set(found))
