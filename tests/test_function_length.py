"""Small functions: no function body in trnfrontier/ runs past 80 lines.

The body is counted from its first statement after the docstring to its end, so a Typer
command's long list of declared options does not count, its logic does."""

from __future__ import annotations

import ast
from pathlib import Path

import trnfrontier

MAX_BODY_LINES = 80
PACKAGE = Path(trnfrontier.__file__).resolve().parent


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    assert node.end_lineno is not None
    return node.end_lineno - body[0].lineno + 1


def test_no_function_body_is_longer_than_80_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = _body_lines(node)
                if lines > MAX_BODY_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "split these (docs/architecture.md says where things go):\n" + "\n".join(long)
