"""The recipes that ship with trnf, found by name or by path."""

from __future__ import annotations

from pathlib import Path

from trnfrontier.trusted_prepare import project_root_file


def shipped_recipes_dir() -> Path | None:
    return project_root_file("recipes")


def shipped_recipes() -> dict[str, Path]:
    """Name -> path of every recipe in the project's recipes/ directory."""
    directory = shipped_recipes_dir()
    if directory is None:
        return {}
    return {path.stem: path for path in sorted(directory.glob("*.yaml"))}


def resolve_recipe_path(ref: str | Path) -> Path:
    """A path as given if it exists, else a shipped recipe's name (``muon_gqa``)."""
    path = Path(ref).expanduser()
    if path.exists():
        return path
    by_name = shipped_recipes().get(str(ref).removesuffix(".yaml"))
    if by_name is not None and path.parent == Path("."):
        return by_name
    return path
