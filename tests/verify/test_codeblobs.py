"""Data carried in code is refused by the screen; prose, code and short constants in strings are not."""

from __future__ import annotations

import ast
import base64

from trnfrontier.verify.codeblobs import BLOB_BYTES, TABLE_NUMBERS, data_in_code


def _found(source: str) -> list[str]:
    return [what for _, what in data_in_code(ast.parse(source))]


def test_long_prose_and_code_in_strings_pass() -> None:
    prose = "This docstring explains the model, at length, with punctuation. " * 100
    template = "def f(x):\n    return x + 1\n" * 200
    hexish = "deadbeef" * 100  # hex, but 400 bytes decoded
    assert _found(f'"""{prose}"""\nT = {template!r}\nH = {hexish!r}\nN = {list(range(100))!r}') == []


def test_blobs_and_tables_are_named() -> None:
    blob = bytes(range(256)) * (BLOB_BYTES // 256)
    found = _found(f"A = {base64.b64encode(blob).decode()!r}\nB = {blob!r}\nC = {blob.hex()!r}\nD = {[-0.5, 0.5] * (TABLE_NUMBERS // 2)!r}")
    assert [f.split(":")[0] for f in found] == [
        f"carries a base64 string of {BLOB_BYTES:,} bytes", f"carries a {BLOB_BYTES:,}-byte bytes literal",
        f"carries a hex string of {BLOB_BYTES:,} bytes", f"carries a literal table of {TABLE_NUMBERS:,} numbers"]
