"""Data carried in code: a weight table or an encoded blob in a shipped .py file.

The checkpoint check proves the weights in ``checkpoint/`` are what they claim; weights kept
in code (a base64 string decoded at import, a bytes literal, a long list of numbers) would
reach the model past it, and the identity check sees them only where they end up in a
parameter or buffer. So the screen refuses them outright: a string or bytes literal of
``BLOB_BYTES`` or more that is binary, base64 or hex, and a literal list or tuple of
``TABLE_NUMBERS`` numbers or more. Code needs neither: 4 KiB of base64 is a thousand float32
weights, and no training script spells out four thousand numbers. Prose and code in a string
(a docstring, a template) are not base64 or hex and pass.
"""

from __future__ import annotations

import ast
import base64
import binascii
import re
from collections.abc import Iterator

BLOB_BYTES = 4096
TABLE_NUMBERS = 4096
_BASE64 = re.compile(rb"[A-Za-z0-9+/=\s]+")
_HEX = re.compile(rb"[0-9a-fA-F\s]+")


def _decoded_size(text: bytes) -> tuple[int, str] | None:
    """The size of what ``text`` decodes to and how it is encoded, when it is base64 or hex."""
    if _HEX.fullmatch(text):
        try:
            return len(bytes.fromhex(text.decode("ascii"))), "hex"
        except ValueError:
            pass
    if _BASE64.fullmatch(text):
        try:
            return len(base64.b64decode(b"".join(text.split()), validate=True)), "base64"
        except (binascii.Error, ValueError):
            return None
    return None


def _blob(value: str | bytes) -> str | None:
    if len(value) < BLOB_BYTES:
        return None
    if isinstance(value, bytes):
        return f"a {len(value):,}-byte bytes literal"
    decoded = _decoded_size(value.encode("utf-8", "surrogatepass"))
    if decoded is not None and decoded[0] >= BLOB_BYTES:
        return f"a {decoded[1]} string of {decoded[0]:,} bytes"
    return None


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):  # -0.5 is USub(0.5)
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _numbers(node: ast.List | ast.Tuple) -> int:
    return sum(_is_number(e) for e in node.elts)


def data_in_code(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, what) for each blob or number table in ``tree``."""
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            what = _blob(node.value)
        elif isinstance(node, (ast.List, ast.Tuple)) and len(node.elts) >= TABLE_NUMBERS and _numbers(node) >= TABLE_NUMBERS:
            what = f"a literal table of {_numbers(node):,} numbers"
        if what:
            yield getattr(node, "lineno", 0), f"carries {what}: weights and data belong in the checkpoint, not in code"
