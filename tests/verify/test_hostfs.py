"""hostfs: what a sandbox wrote is read without following links, blocking or growing, and removed whatever its shape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trnfrontier.untrusted.hostfs import (
    UnsafeFile,
    find_files,
    private_dir,
    read_capped,
    remove_tree,
)


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    (root / "logs").mkdir(parents=True)
    (root / "logs" / "steps.jsonl").write_text('{"step": 0}\n')
    return root


def test_a_regular_file_is_read_whole(tree: Path) -> None:
    assert read_capped(tree, "logs/steps.jsonl", 100) == b'{"step": 0}\n'


@pytest.mark.parametrize("make,why", [
    (lambda p: os.symlink("/proc/self/environ", p), "symbolic link"),
    (lambda p: os.symlink("/dev/zero", p), "symbolic link"),
    (lambda p: os.mkfifo(p), "FIFO"),
    (lambda p: os.mkdir(p), "directory"),
])
def test_links_fifos_and_directories_are_refused_without_blocking(tree: Path, make, why: str) -> None:
    make(tree / "logs" / "bad")
    with pytest.raises(UnsafeFile, match=why):
        read_capped(tree, "logs/bad", 1 << 20)


def test_a_linked_parent_directory_is_not_followed(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "steps.jsonl").write_text("TOKEN=secret\n")
    os.symlink(tmp_path / "secret", tree / "linked")
    with pytest.raises(UnsafeFile, match="not a plain directory"):
        read_capped(tree, "linked/steps.jsonl", 100)


def test_a_file_over_its_cap_is_refused_unread(tree: Path) -> None:
    with pytest.raises(UnsafeFile, match="over the 4-byte limit"):
        read_capped(tree, "logs/steps.jsonl", 4)


def test_an_absent_file_is_file_not_found(tree: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_capped(tree, "logs/absent.jsonl", 100)


def _nest(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):  # deeper than any path the host could name
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    os.close(fd)


def test_the_walk_has_depth_and_size_limits_and_follows_no_link(tree: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path, tree / "up")
    assert [rel for rel, _ in find_files(tree)] == ["logs/steps.jsonl"]
    _nest(tree, 40)
    with pytest.raises(UnsafeFile, match="deeper than 32"):
        find_files(tree)
    with pytest.raises(UnsafeFile, match="more than 3"):
        find_files(tree, max_entries=3, max_depth=100)


def test_remove_tree_handles_deep_nesting_locked_dirs_fifos_and_links(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    os.symlink(outside, tree / "link-to-outside")
    os.mkfifo(tree / "fifo")
    _nest(tree, 1500)  # a recursive rmtree raises RecursionError here; paths exceed PATH_MAX
    (tree / "locked" / "inner").mkdir(parents=True)
    (tree / "locked" / "inner" / "f").write_text("x")
    os.chmod(tree / "locked" / "inner", 0)
    os.chmod(tree / "locked", 0)
    remove_tree(tree)
    assert not tree.exists() and (outside / "keep.txt").read_text() == "keep"


def test_private_dir_is_removed_when_the_block_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(RuntimeError), private_dir("trnf-test-") as path:
        (path / "a").mkdir()
        os.chmod(path / "a", 0)
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
