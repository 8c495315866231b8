"""The static screen: what the organisers' analysis would flag, found by AST, never by importing.

Every shipped .py file is screened for imports, network/process use, validation-data
references and monkeypatching of prepare; train.py must also define ``load_for_eval``.
The screen is deliberately conservative: an obfuscated import (``__import__(name)``
with a computed name, ``exec``/``eval`` of a string) is flagged, because the
organisers' screen cannot see through it either; ``screen_bypass`` adds the known
families of hiding code from a name-based screen. It is a fast first filter: the
sandbox (``sandbox.py``) is the boundary, whatever gets past this.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trnfrontier.contract.allowed_imports import ORGANISER_PACKAGES
from trnfrontier.verify.codeblobs import data_in_code
from trnfrontier.verify.screen_bypass import bypass_findings

# Modules that reach the network or start processes; never needed to train or evaluate.
FORBIDDEN_MODULES = frozenset(
    {
        "socket", "ssl", "socketserver", "http", "urllib", "urllib3", "requests", "httpx", "aiohttp",
        "ftplib", "smtplib", "poplib", "imaplib", "telnetlib", "xmlrpc", "asyncio", "webbrowser",
        "subprocess", "pty", "ctypes", "cffi", "ensurepip", "pip",
    }
)
FORBIDDEN_OS_CALLS = frozenset(
    {
        "system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "startfile",
        "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
        "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
    }
)
# String literals (or substrings) that name the validation split or its shard.
VAL_STRINGS = frozenset({"val", "public_val", "validation"})
VAL_SUBSTRINGS = ("public_val", "shard_06542", "06542")
VAL_NAMES = frozenset({"VAL_SHARD"})
# Names of a score, not of data: the kit baseline prints its in-process eval as
# `public_val_bpb: ...` in its `---` block; the score's name reads no validation text.
SCORE_NAMES = ("public_val_bpb",)
# Calls where naming the validation split is the trusted scorer measuring, not training on it.
_TRUSTED_EVAL_CALLS = frozenset({"evaluate_bpb"})


@dataclass
class Finding:
    file: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}" if self.line else f"{self.file}: {self.what}"


@dataclass
class ScreenResult:
    findings: list[Finding] = field(default_factory=list)
    defines_load_for_eval: bool = False


def _root(node: ast.AST) -> str | None:
    """The name at the root of an attribute/subscript chain (``a`` in ``a.b[c].d``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_sys_modules_prepare(node: ast.AST, sys_names: set[str]) -> bool:
    """``sys.modules["prepare"]``: other entries may be registered freely (a flattened runtime does)."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "modules"
        and _root(node.value) in sys_names
        and isinstance(node.slice, ast.Constant)
        and node.slice.value == "prepare"
    )


def _call_name(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


class _Screener(ast.NodeVisitor):
    def __init__(self, file: str, local_modules: set[str]) -> None:
        self.file = file
        self.local = local_modules
        self.findings: list[Finding] = []
        self.prepare_names: set[str] = set()  # names bound to prepare or to things imported from it
        self.os_names: set[str] = set()
        self.sys_names: set[str] = {"sys"}
        self.os_functions: dict[str, str] = {}  # local name -> forbidden os function it is
        self.trusted_eval_depth = 0

    def flag(self, node: ast.AST, what: str) -> None:
        self.findings.append(Finding(self.file, getattr(node, "lineno", 0), what))

    # imports -------------------------------------------------------------------------
    def _check_module(self, node: ast.AST, module: str) -> None:
        top = module.split(".")[0]
        if top in FORBIDDEN_MODULES:
            self.flag(node, f"imports {module} (network or process use is not allowed)")
        elif top in sys.stdlib_module_names or top in ORGANISER_PACKAGES or top in self.local:
            return
        else:
            self.flag(node, f"imports {module}, which is not in the organisers' environment nor shipped in the archive")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            bound = alias.asname or alias.name.split(".")[0]
            if alias.name == "prepare":
                self.prepare_names.add(bound)
            if alias.name == "os":
                self.os_names.add(bound)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._check_module(node, node.module)
            for alias in node.names:
                bound = alias.asname or alias.name
                if node.module == "prepare":
                    self.prepare_names.add(bound)
                    if alias.name in VAL_NAMES:
                        self.flag(node, f"imports {alias.name} from prepare (the validation shard)")
                if node.module == "os" and alias.name in FORBIDDEN_OS_CALLS:
                    self.flag(node, f"imports os.{alias.name} (process use is not allowed)")
                if alias.name in FORBIDDEN_MODULES:
                    self.flag(node, f"imports {node.module}.{alias.name} (network or process use is not allowed)")
        self.generic_visit(node)

    # calls ---------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        name = _call_name(node)
        func = node.func
        if isinstance(func, ast.Name) and func.id in {"exec", "eval"}:
            self.flag(node, f"calls {func.id}() (code the screen cannot see)")
        if name in {"__import__", "import_module"}:
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                self._check_module(node, arg.value)
            else:
                self.flag(node, f"calls {name}() with a computed module name (an import the screen cannot see)")
        if isinstance(func, ast.Name) and func.id in {"setattr", "delattr"} and node.args:
            if _root(node.args[0]) in self.prepare_names:
                self.flag(node, f"{func.id}() on prepare (monkeypatching the trusted module)")
            target = node.args[0]
            if isinstance(target, ast.Name) and target.id in self.sys_names:  # setattr(sys, "modules", ...)
                self.flag(node, f"{func.id}() on sys")
        if isinstance(func, ast.Name) and func.id == "vars" and node.args and _root(node.args[0]) in self.prepare_names:
            self.flag(node, "vars(prepare) (reaching into the trusted module's namespace)")
        if isinstance(func, ast.Attribute) and func.attr in FORBIDDEN_OS_CALLS and _root(func) in self.os_names:
            self.flag(node, f"calls os.{func.attr} (process use is not allowed)")
        trusted = name in _TRUSTED_EVAL_CALLS
        self.trusted_eval_depth += trusted
        self.generic_visit(node)
        self.trusted_eval_depth -= trusted

    # validation data ----------------------------------------------------------------
    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and self.trusted_eval_depth == 0:
            text = node.value.strip().lower()
            for name in SCORE_NAMES:
                text = text.replace(name, "")
            if text in VAL_STRINGS or any(s in text for s in VAL_SUBSTRINGS):
                self.flag(node, f"refers to the validation split/shard ({node.value[:40]!r})")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in VAL_NAMES:
            self.flag(node, f"refers to {node.id} (the validation shard)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in VAL_NAMES:
            self.flag(node, f"refers to {node.attr} (the validation shard)")
        if node.attr == "__dict__" and _root(node) in self.prepare_names:
            self.flag(node, "prepare.__dict__ (reaching into the trusted module's namespace)")
        self.generic_visit(node)

    # monkeypatching ------------------------------------------------------------------
    def _check_targets(self, node: ast.AST, targets: list[ast.expr]) -> None:
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, (ast.Attribute, ast.Subscript)) and _root(sub) in self.prepare_names:
                    self.flag(node, "assigns into prepare (monkeypatching the trusted module)")
                    return
                if _is_sys_modules_prepare(sub, self.sys_names):
                    self.flag(node, "replaces sys.modules['prepare'] (substituting the trusted module)")
                    return

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_targets(node, node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_targets(node, [node.target])
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_targets(node, [node.target])
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._check_targets(node, node.targets)
        self.generic_visit(node)


def _defines_load_for_eval(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "load_for_eval":
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "load_for_eval" for t in node.targets):
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == "load_for_eval" for a in node.names):
            return True
    return False


def local_modules(names: list[str]) -> set[str]:
    """Top-level importable names the archive itself provides (``foo.py`` or ``foo/...py``)."""
    found: set[str] = set()
    for name in names:
        if name.endswith(".py"):
            parts = name.split("/")
            found.add(parts[0][:-3] if len(parts) == 1 else parts[0])  # "train" included: helpers may import it
    return found


def screen_source(source: str, file: str, local: set[str]) -> ScreenResult:
    """Screen one file's source text."""
    result = ScreenResult()
    try:
        tree = ast.parse(source, filename=file)
    except SyntaxError as exc:
        result.findings.append(Finding(file, exc.lineno or 0, f"does not parse: {exc.msg}"))
        return result
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, absurd nesting: hostile input
        result.findings.append(Finding(file, 0, f"does not parse: {type(exc).__name__}"))
        return result
    screener = _Screener(file, local)
    # Bind names first so an assignment above the import still counts (two passes).
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "prepare":
                    screener.prepare_names.add(alias.asname or "prepare")
                if alias.name == "os":
                    screener.os_names.add(alias.asname or "os")
                if alias.name == "sys":
                    screener.sys_names.add(alias.asname or "sys")
    screener.visit(tree)
    found = [*bypass_findings(tree), *data_in_code(tree)]
    result.findings = screener.findings + [Finding(file, line, what) for line, what in found]
    result.defines_load_for_eval = _defines_load_for_eval(tree)
    return result


def screen_files(root: Path, names: list[str]) -> tuple[list[Finding], bool]:
    """Screen every .py member under ``root``; returns the findings and whether train.py defines load_for_eval."""
    return screen_members(names, lambda name: root.joinpath(*name.split("/")).read_text(encoding="utf-8"))


def screen_members(names: Iterable[str], read_text: Callable[[str], str]) -> tuple[list[Finding], bool]:
    """Screen every .py member of ``names`` (``read_text(name)``: its UTF-8 source, raising
    UnicodeDecodeError when it is not); the findings and whether train.py defines load_for_eval."""
    names = list(names)
    local = local_modules(names)
    findings: list[Finding] = []
    has_load = False
    for name in sorted(n for n in names if n.endswith(".py")):
        try:
            source = read_text(name)
        except UnicodeDecodeError:
            findings.append(Finding(name, 0, "is not UTF-8 text"))
            continue
        result = screen_source(source, name, local)
        findings.extend(result.findings)
        if name == "train.py":
            has_load = result.defines_load_for_eval
    if "train.py" in names and not has_load:
        findings.append(Finding("train.py", 0, "does not define load_for_eval(checkpoint_path, device)"))
    return findings, has_load
