"""The NKI Python subset, checked on a kernel file's AST before the interpreter runs it.

The NKI front-end (NKI 0.3+, the ``nki.*`` namespace) parses kernel functions itself and
rejects Python it does not translate. This module rejects the same constructs, with the
file and line, so a kernel that runs here is not one the compiler refuses to parse.

Two lists (sources in kernels/README.md, section 6):

- ``FRONT_END``: what the front-end's gather/simplify passes reject (leanprover/KLR
  ``interop/klr/gather.c`` and ``KLR/NKI/Simplify.lean``): comprehensions, generator
  expressions, lambdas, walrus, yield/await, try/raise, global/nonlocal, del, match,
  nested def/class, imports inside a function, starred expressions, ``**kwargs`` calls,
  ``*args`` parameters, for/while ``else``, f-string format specifiers, ``with`` (the
  front-end accepts only its own with-forms, not modelled here); a for target that is
  not one simple name under NKI 0.6 (0.7 traces Python and accepts it: versions.py).
- ``PORTABLE``: legal NKI (``while`` loops, unrolled at specialization: NKI language
  guide; f-strings and dict literals: KLR gather.c) that this repository's own kernels
  avoid so that they parse on every NKI 0.3+ release a team may have. Checked only with
  ``portable=True`` (the shipped kernels' style test), never as an NKI rule.

Every function defined at module level in a kernel file is checked: helpers are inlined
into the kernels that call them, so they are kernel code too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .machine import NkiInterpreterError
from .versions import NkiVersion, resolve


class NkiSubsetError(NkiInterpreterError):
    """A kernel file uses Python outside the NKI subset (the front-end would reject it)."""


FRONT_END: dict[type, str] = {
    ast.ListComp: "a list comprehension",
    ast.SetComp: "a set comprehension",
    ast.DictComp: "a dict comprehension",
    ast.GeneratorExp: "a generator expression",
    ast.Lambda: "a lambda",
    ast.NamedExpr: "an assignment expression (:=)",
    ast.Yield: "yield",
    ast.YieldFrom: "yield from",
    ast.Await: "await",
    ast.Try: "a try statement",
    ast.Raise: "a raise statement",
    ast.Global: "a global statement",
    ast.Nonlocal: "a nonlocal statement",
    ast.Delete: "a del statement",
    ast.Match: "a match statement",
    ast.FunctionDef: "a nested function definition",
    ast.AsyncFunctionDef: "an async function",
    ast.ClassDef: "a class definition inside a function",
    ast.Import: "an import inside a function",
    ast.ImportFrom: "an import inside a function",
    ast.Starred: "a starred expression (*x)",
    ast.With: "a with statement",
}
if hasattr(ast, "TryStar"):  # Python 3.11+
    FRONT_END[ast.TryStar] = "a try statement"

PORTABLE: dict[type, str] = {
    ast.While: "a while loop",
    ast.JoinedStr: "an f-string",
    ast.Dict: "a dict literal",
}


def _violation(node: ast.AST, version: NkiVersion, portable: bool) -> str | None:
    tables = [(FRONT_END, "the NKI front-end rejects it")]
    if portable:
        tables.append((PORTABLE, "legal NKI, but not portable to older releases"))
    for table, why in tables:
        for kind, what in table.items():
            if isinstance(node, kind):
                return f"{what} ({why})"
    if isinstance(node, ast.Call) and any(k.arg is None for k in node.keywords):
        return "keyword expansion (**kwargs) (the NKI front-end rejects it)"
    if isinstance(node, (ast.For, ast.While)) and node.orelse:
        return "a loop with an else clause (the NKI front-end rejects it)"
    tuple_target = isinstance(node, ast.For) and not isinstance(node.target, ast.Name)
    if tuple_target and not version.tuple_loop_targets:
        return (
            f"a for loop over a tuple target (the NKI {version.name} front-end wants one "
            "simple variable)"
        )
    if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
        return "an f-string format specifier (the NKI front-end rejects it)"
    return None


def _check_function(fn: ast.FunctionDef, path: str, version: NkiVersion, portable: bool) -> None:
    if fn.args.vararg is not None or fn.args.kwarg is not None:
        raise NkiSubsetError(
            f"{path}:{fn.lineno}: {fn.name}() takes *args/**kwargs, which NKI does not support"
        )
    for stmt in fn.body:
        for node in ast.walk(stmt):
            what = _violation(node, version, portable)
            if what is not None:
                line = getattr(node, "lineno", fn.lineno)
                raise NkiSubsetError(
                    f"{path}:{line}: {fn.name}() uses {what}; rewrite it with plain loops, "
                    "tuples/lists and if/else (see kernels/README.md, the NKI Python subset)"
                )


def check_source(
    source: str, path: str | Path, version: NkiVersion | None = None, portable: bool = False
) -> None:
    """Raise NkiSubsetError at the first construct outside the NKI subset (of ``version``,
    default versions.resolve()) in any function; ``portable`` adds the PORTABLE list."""
    version = version or resolve()
    tree = ast.parse(source, filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.AsyncFunctionDef):
            raise NkiSubsetError(f"{path}:{node.lineno}: async functions are not NKI kernels")
        if isinstance(node, ast.FunctionDef):
            _check_function(node, str(path), version, portable)
