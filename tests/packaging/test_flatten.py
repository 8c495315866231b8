"""flatten: modules merged into one namespace, dependency-ordered, collisions refused."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trnfrontier.packaging.flatten import FlattenError, flatten


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / name).write_text(text)
    return pkg


def _run(source: str) -> dict:
    namespace: dict = {}
    code = compile(source, "flat.py", "exec")  # the merged text is a plain module
    exec(code, namespace)  # noqa: S102 - test only: run the generated module
    return namespace


def test_merges_in_dependency_order_and_rewrites_module_attributes(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "b.py": '"""B doc."""\nfrom __future__ import annotations\nimport math\n\nfrom pkg import a\nfrom pkg.a import base as b0\n\n\ndef twice():\n    return a.base() * 2 + b0() + math.floor(0.5)\n',
            "a.py": "from __future__ import annotations\nfrom typing import Callable\n\n\ndef base():  # a comment that survives\n    return 21\n\n__all__ = ['base']\n",
        },
    )
    merged = flatten(pkg, "pkg", ["b"])
    assert merged.modules == ("a.py", "b.py")
    assert (
        "a.base" not in merged.source
        and "import pkg" not in merged.source
        and "from pkg" not in merged.source
    )
    assert "# a comment that survives" in merged.source and "# B doc." in merged.source
    assert merged.source.startswith("from __future__ import annotations\n")
    assert _run(merged.source)["twice"]() == 63


def test_collision_between_modules_is_an_error(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "a.py": "X = 1\n",
            "b.py": "from pkg.a import X\nX2 = X\n",
            "c.py": "from pkg import b\nX = 3\n",
        },
    )
    with pytest.raises(FlattenError, match=r"'X' is defined in a.py:1 and in c.py:2"):
        flatten(pkg, "pkg", ["c"])


def test_collision_with_reserved_and_imports_and_module_assignment(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {"a.py": "def main():\n    pass\n"})
    with pytest.raises(FlattenError, match="'main' is defined in the generated train.py"):
        flatten(pkg, "pkg", ["a"], {"main": "entry point"})
    pkg2 = _package(
        tmp_path / "two",
        {"a.py": "import json as j\n", "b.py": "from pkg import a\nimport pickle as j\n"},
    )
    with pytest.raises(FlattenError, match="'j' is json"):
        flatten(pkg2, "pkg", ["b"])
    pkg3 = _package(
        tmp_path / "three",
        {"a.py": "V = 1\n", "b.py": "from pkg import a\n\ndef f():\n    a.V = 2\n"},
    )
    with pytest.raises(FlattenError, match="assigns a.V"):
        flatten(pkg3, "pkg", ["b"])


def test_the_runtime_flattens_without_collisions() -> None:
    import trnfrontier.runtime as runtime

    merged = flatten(
        Path(runtime.__file__).parent,
        "trnfrontier.runtime",
        ["trainer", "checkpoint"],
        omit={"kernels": "no kernels in this file"},
    )
    tree = ast.parse(merged.source)
    assert merged.modules[-1] == "trainer.py" and merged.modules.index(
        "model.py"
    ) < merged.modules.index("checkpoint.py")
    assert not [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("trnfrontier")
    ]
    assert not [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id in ("exec", "eval")
    ]
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert "load_for_eval" in defined and "train" in defined and len(defined) == len(set(defined))


def test_omitted_modules_may_only_be_imported_lazily(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "extra.py": "def helper():\n    return 1\n",
            "main.py": "def run(flag):\n    if flag:\n        from pkg.extra import helper\n        return helper()\n    return 0\n",
        },
    )
    merged = flatten(pkg, "pkg", ["main"], omit={"extra": "extra is not shipped"})
    assert (
        merged.modules == ("main.py",)
        and "raise ImportError('extra is not shipped')" in merged.source
    )
    namespace = _run(merged.source)
    assert namespace["run"](False) == 0
    with pytest.raises(ImportError, match="extra is not shipped"):
        namespace["run"](True)
    (pkg / "eager.py").write_text("from pkg.extra import helper\n")
    with pytest.raises(FlattenError, match="lazily"):
        flatten(pkg, "pkg", ["eager"], omit={"extra": "x"})
