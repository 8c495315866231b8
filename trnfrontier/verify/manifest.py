"""The manifest check: manifest.json lists exactly the archive's other files, with true sizes and SHA256."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from trnfrontier.contract.jsonstrict import StrictJSONError, strict_loads
from trnfrontier.submission import (
    FORMAT,
    MANIFEST,
    REQUIRED_MEMBERS,
    is_allowed_member,
    member_path,
)
from trnfrontier.verify.report import Check, failed, passed

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_MAX_MANIFEST_BYTES = 4 << 20
MANIFEST_KEYS = ("prepare_sha256", "tokenizer_sha256", "claimed", "params", "versions", "git", "seed", "launch", "forced")


def load_manifest(root: Path) -> dict[str, Any] | str:
    """The parsed manifest, or the reason it cannot be used."""
    path = member_path(root, MANIFEST)
    if not path.is_file():
        return "manifest.json is missing"
    if path.stat().st_size > _MAX_MANIFEST_BYTES:
        return f"manifest.json is over {_MAX_MANIFEST_BYTES} bytes"
    try:
        data = strict_loads(path.read_bytes(), what="manifest.json")
    except StrictJSONError as exc:
        return str(exc)
    if not isinstance(data, dict):
        return "manifest.json is not a JSON object"
    if data.get("format") != FORMAT:
        return f"manifest.json format is {data.get('format')!r}, expected {FORMAT!r}"
    if not isinstance(data.get("files"), dict):
        return "manifest.json has no 'files' object"
    missing = [key for key in MANIFEST_KEYS if key not in data]
    if missing:
        return f"manifest.json lacks {', '.join(missing)}"
    return data


def shadows_prepare(name: str) -> bool:
    """Whether member ``name`` could be imported as ``prepare`` (prepare.py or a prepare/ package, at any depth)."""
    parts = name.split("/")
    return parts[-1] == "prepare.py" or "prepare" in parts[:-1]


def check_manifest(manifest: dict[str, Any] | str, extracted: dict[str, dict[str, object]]) -> Check:
    """Compare the manifest with what extraction measured (sizes and SHA256 of every member)."""
    if isinstance(manifest, str):
        return failed("manifest", manifest)
    listed: dict[str, Any] = manifest["files"]
    present = {name for name in extracted if name != MANIFEST}
    problems: list[str] = []
    for name in sorted(set(listed) - present):
        problems.append(f"{name} listed but not in the archive")
    for name in sorted(present - set(listed)):
        problems.append(f"{name} in the archive but not listed")
    for name in sorted(present & set(listed)):
        entry = listed[name]
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) or not _HEX64.match(entry["sha256"]):
            problems.append(f"{name}: entry needs size and a hex sha256")
            continue
        if entry.get("size") != extracted[name]["size"]:
            problems.append(f"{name}: size {entry.get('size')} listed, {extracted[name]['size']} in the archive")
        elif entry["sha256"] != extracted[name]["sha256"]:
            problems.append(f"{name}: SHA256 does not match its content")
    for name in sorted(present):
        if not is_allowed_member(name):
            problems.append(f"{name} is not part of the submission format")
        elif shadows_prepare(name):
            problems.append(f"{name}: an archive may not ship its own prepare (the trusted prepare.py always comes first)")
    missing = [n for n in REQUIRED_MEMBERS if n != MANIFEST and n not in present]
    if missing:
        problems.append(f"required member(s) missing: {', '.join(missing)}")
    if problems:
        extra = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return failed("manifest", problems[0] + extra)
    return passed("manifest", f"{len(present)} files listed, sizes and SHA256 match")
