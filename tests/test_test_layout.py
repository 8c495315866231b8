"""The suite's own layout: pytest (rootdir imports, no packages under tests/) cannot collect
two test modules with the same file name, and fails the whole run at collection when one
directory's run passes on its own. Tests mirror the package layout, so such names recur
(`launch`, `phases`): name the second one after what it tests."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_two_test_modules_share_a_file_name() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in sorted(TESTS.rglob("test_*.py")):
        if "fixtures" not in path.relative_to(TESTS).parts:
            where[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not clashes, f"rename one of each pair: {clashes}"
