"""Pins: the SHA256 of the prepare.py and tokenizer a submission must have used.

Pins are configuration, so a team can pin the organisers' copy. In order:
1. ``trnf verify --pins FILE``;
2. ``$TRNF_HOME/pins.json`` (``TRNF_HOME`` defaults to ``~/.cache/trnfrontier``);
3. defaults: the SHA256 of the selected trusted prepare.py (``--prepare`` /
   ``TRNF_PREPARE`` / the project's) and of its tokenizer: the artifact shipped beside
   it (``artifacts/tokenizer*.zip``, as the organisers' kit and the project's prepare.py
   do), else what the active dataset's manifest pins (``TRNF_DATASET`` or ``active`` under
   the data home: the artifact it was unpacked from, else its own ``tokenizer.pkl``).

A pins file is JSON: ``{"prepare_sha256": hex, "tokenizer_sha256": hex}``; either key
may be absent (then that pin comes from the defaults).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.runtime.data_home import data_home
from trnfrontier.runtime.prepare_loader import sha256_file


@dataclass(frozen=True)
class Pin:
    sha256: str | None
    source: str  # where the value came from, or why there is none

    def matches(self, value: object) -> bool:
        """Whether ``value`` (a recorded or claimed SHA256, any case) is this pin; never when nothing is pinned."""
        return self.sha256 is not None and isinstance(value, str) and value.lower() == self.sha256


@dataclass(frozen=True)
class Pins:
    prepare: Pin
    tokenizer: Pin


def trnf_home() -> Path:
    return Path(os.environ.get("TRNF_HOME") or "~/.cache/trnfrontier").expanduser()


def _active_tokenizer() -> tuple[str, str] | None:
    """(pin, where) of the active dataset's tokenizer, as its manifest records it (a dataset
    unpacked from an artifact is pinned by the artifact's SHA256, like prepare.tokenizer_pin)."""
    home = data_home()
    name = os.environ.get("TRNF_DATASET")
    if not name and (home / "active").is_file():
        name = (home / "active").read_text().strip()
    if not name:
        return None
    manifest_path = home / "datasets" / name / "manifest.json"
    try:
        entry = json.loads(manifest_path.read_text(encoding="utf-8"))["tokenizer"]
        file = (manifest_path.parent / entry["path"]).resolve()
        if entry.get("artifact_sha256"):
            return str(entry["artifact_sha256"]), f"tokenizer artifact SHA256 in {manifest_path}"
        return sha256_file(file), f"SHA256 of {file}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _default_prepare() -> Pin:
    from trnfrontier.trusted_prepare import selected_prepare_path

    try:
        path = selected_prepare_path()
    except TrnfError as exc:
        return Pin(None, f"no trusted prepare.py to pin ({exc}); pass --pins FILE")
    return Pin(sha256_file(path), f"SHA256 of {path}")


def _default_tokenizer() -> Pin:
    from trnfrontier.trusted_prepare import selected_prepare_path, tokenizer_sha256_of

    try:  # the selected prepare.py's own pinned artifact (the organisers' kit) comes first
        shipped, where = tokenizer_sha256_of(selected_prepare_path())
    except TrnfError:
        shipped, where = None, ""
    if shipped is not None:
        return Pin(shipped, where)
    active = _active_tokenizer()
    if active is None:
        return Pin(None, f"no prepared tokenizer under {data_home()} (run `trnf prepare` or pin tokenizer_sha256 in a pins file)")
    return Pin(*active)


def check_pins_file(pins_file: Path | None) -> None:
    """A ``--pins`` that names no file is a usage error, found before any other work."""
    if pins_file is not None and not pins_file.is_file():
        raise UsageError(f"--pins {pins_file}: no such file")


def load_pins(pins_file: Path | None = None) -> Pins:
    """Resolve the pins (see the module docstring for the order)."""
    configured: dict[str, object] = {}
    source = ""
    candidate = pins_file if pins_file is not None else trnf_home() / "pins.json"
    check_pins_file(pins_file)
    if candidate.is_file():
        try:
            configured = json.loads(candidate.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TrnfError(f"{candidate} is not valid JSON ({exc}); expected {{\"prepare_sha256\": ..., \"tokenizer_sha256\": ...}}") from None
        if not isinstance(configured, dict):
            raise TrnfError(f"{candidate} must be a JSON object with prepare_sha256 / tokenizer_sha256")
        source = str(candidate)

    def pick(key: str, default) -> Pin:
        value = configured.get(key)
        if isinstance(value, str) and value:
            return Pin(value.lower(), f"{key} in {source}")
        return default()

    return Pins(prepare=pick("prepare_sha256", _default_prepare), tokenizer=pick("tokenizer_sha256", _default_tokenizer))
