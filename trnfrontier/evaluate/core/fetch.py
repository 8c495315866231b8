"""``--bundle PATH|URL|sample``: a checked CORE bundle folder, whatever was named.

- ``sample``: the format sample shipped as ``artifacts/core_sample_bundle.zip`` (pinned
  below; a score on it means nothing);
- a folder holding ``core.yaml`` (or ``eval_bundle/core.yaml``);
- a zip holding ``eval_bundle/`` (nanochat's ``eval_bundle.zip``);
- an ``http(s)://`` URL of such a zip, downloaded into the data home
  (``<home>/core/downloads/``), resumable and renamed into place only when complete, by
  prepare.py's shard downloader;
- a pin file (``.yaml``/``.yml``/``.json``) with ``bundle:`` (any of the above) and
  ``sha256:``: the organisers publish their bundle's SHA256, a team writes it down once.

A zip's SHA256 is checked against the pin (``--bundle-sha256`` or the pin file) before it
is opened, then unpacked once into ``<home>/core/bundles/<sha256>/``: members only under
``eval_bundle/``, no absolute or ``..`` paths, no links or devices, at most
``MAX_MEMBERS`` files and ``MAX_UNPACKED_BYTES`` bytes (counted as written), assembled
under a temporary name and renamed into place. A folder's identity is the SHA256 of the
files a score reads (``tree_sha256``).

Several processes may resolve the same bundle at once (the trials of a ``metric: core``
sweep): downloads and unpacks run under one ``fcntl`` lock, ``<home>/core/.lock``, so one
process writes the shared ``.partial`` file and the others wait and then find the zip;
a complete unpacked folder (its name is the zip's SHA256, so it matches the pin) is never
removed or replaced, since another process may be reading it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import stat
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

from trnfrontier.errors import TrnfError, UsageError
from trnfrontier.evaluate.core.bundle import (
    CONFIG_FILE,
    META_FILE,
    Bundle,
    BundleError,
    read_bundle,
)
from trnfrontier.runtime.data_home import data_home
from trnfrontier.runtime.prepare_loader import sha256_file
from trnfrontier.trusted_prepare import default_prepare_path, project_root_file

SAMPLE = "sample"
SAMPLE_BUNDLE_FILE = "artifacts/core_sample_bundle.zip"
# scripts/build_core_sample_bundle.py rebuilds the file byte for byte (--check).
SAMPLE_BUNDLE_SHA256 = "ad9a9785bc087e0b781d7f31f2854a0095af27f2dd0de05b2b66af280c03a850"
BUNDLE_ENV = "TRNF_CORE_BUNDLE"
ZIP_ROOT = "eval_bundle"
MAX_MEMBERS = 100_000
MAX_UNPACKED_BYTES = 4 << 30
PIN_SUFFIXES = (".yaml", ".yml", ".json")
LOCK_FILE = ".lock"  # under <home>/core/
DOWNLOAD_ADVICE = "check the network and the --bundle URL, or download the zip yourself and pass --bundle PATH"


@dataclass(frozen=True)
class ResolvedBundle:
    """A readable bundle and what identifies it."""

    bundle: Bundle
    sha256: str  # of the zip, or of the folder's scored files (``tree_sha256``)
    sha256_of: str  # "zip" or "folder"
    source: str  # what --bundle named
    pinned: bool  # the SHA256 was checked against a pin
    sample: bool  # the shipped format sample: the score means nothing


def _check_pin(sha: str, pin: str | None, what: str) -> None:
    if pin is not None and sha != pin:
        raise TrnfError(
            f"{what} has SHA256 {sha}, but the pin is {pin}; it is not the bundle you pinned "
            "(a different version, or damaged): fix the pin or get the pinned bundle"
        )


def _normal_pin(pin: str | None, where: str) -> str | None:
    if pin is None:
        return None
    value = pin.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise UsageError(f"{where} {pin!r} is not a SHA256 (64 hexadecimal digits)")
    return value


def tree_sha256(bundle: Bundle) -> str:
    """SHA256 over the files a score reads: core.yaml, the CSV and every task file."""
    paths = [bundle.root / CONFIG_FILE, bundle.root / META_FILE, *(bundle.data_path(task) for task in bundle.tasks)]
    digest = hashlib.sha256()
    for path in sorted(set(paths)):
        digest.update(f"{path.relative_to(bundle.root).as_posix()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def resolve(spec: str | None, pin: str | None = None) -> ResolvedBundle:
    """The bundle ``spec`` names (default ``$TRNF_CORE_BUNDLE``), checked against ``pin``."""
    spec = spec or os.environ.get(BUNDLE_ENV)
    if not spec:
        raise UsageError(
            f"--core needs a bundle: --bundle URL|ZIP|FOLDER with --bundle-sha256 (the organisers publish it), "
            f"a pin file, or --bundle {SAMPLE} for the offline format sample (its score means nothing); or set {BUNDLE_ENV}"
        )
    pin = _normal_pin(pin, "--bundle-sha256")
    if spec == SAMPLE:
        return _sample(pin)
    if re.match(r"https?://", spec):
        return _from_url(spec, pin)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _from_folder(path, spec, pin)
    if path.is_file() and path.suffix.lower() in PIN_SUFFIXES:
        return _from_pin_file(path, pin)
    if path.is_file():
        return _from_zip(path, spec, pin)
    raise UsageError(f"--bundle {spec}: no such file or folder (give a folder, a zip, an http(s) URL, a pin file or {SAMPLE})")


def _sample(pin: str | None) -> ResolvedBundle:
    path = project_root_file(SAMPLE_BUNDLE_FILE)
    if path is None:
        raise TrnfError(f"the format sample {SAMPLE_BUNDLE_FILE} is missing from this installation; reinstall trnf")
    sha = sha256_file(path)
    if sha != SAMPLE_BUNDLE_SHA256:
        raise TrnfError(f"{path} has SHA256 {sha}, not the pinned {SAMPLE_BUNDLE_SHA256} (damaged); restore it (git checkout -- artifacts/)")
    _check_pin(sha, pin, f"the format sample {path}")
    resolved = _from_zip(path, SAMPLE, None)
    return ResolvedBundle(resolved.bundle, sha, "zip", SAMPLE, True, sample=True)


def _from_folder(path: Path, source: str, pin: str | None) -> ResolvedBundle:
    root = path / ZIP_ROOT if not (path / CONFIG_FILE).exists() and (path / ZIP_ROOT / CONFIG_FILE).exists() else path
    bundle = read_bundle(root)
    sha = tree_sha256(bundle)
    _check_pin(sha, pin, f"bundle folder {root} (SHA256 of core.yaml, the CSV and the task files)")
    return ResolvedBundle(bundle, sha, "folder", source, pin is not None, sample=False)


def _from_pin_file(path: Path, pin: str | None) -> ResolvedBundle:
    import json

    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data: Any = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"--bundle {path}: not a readable pin file ({type(exc).__name__}); it holds `bundle: URL|PATH` and `sha256: ...`") from None
    if not isinstance(data, dict) or not isinstance(data.get("bundle"), str) or not isinstance(data.get("sha256"), str):
        raise UsageError(f"--bundle {path}: a pin file holds `bundle: URL|PATH` and `sha256: <64 hex digits>`")
    pinned = _normal_pin(data["sha256"], f"{path}: sha256")
    if pin is not None and pin != pinned:
        raise UsageError(f"--bundle-sha256 {pin} disagrees with the pin in {path} ({pinned}); give one")
    target = data["bundle"]
    if not re.match(r"https?://", target) and target != SAMPLE and not Path(target).expanduser().is_absolute():
        target = str(path.parent / target)  # relative to the pin file
    if target.lower().endswith(PIN_SUFFIXES):
        raise UsageError(f"--bundle {path}: its bundle is another pin file; name the zip, folder or URL")
    resolved = resolve(target, pinned)
    return ResolvedBundle(resolved.bundle, resolved.sha256, resolved.sha256_of, str(path), True, resolved.sample)


def _from_zip(path: Path, source: str, pin: str | None) -> ResolvedBundle:
    if not zipfile.is_zipfile(path):
        raise BundleError(f"--bundle {source}: {path} is not a zip file (nor a folder, URL or pin file)")
    sha = sha256_file(path)
    _check_pin(sha, pin, f"bundle {path}")
    folder = data_home() / "core" / "bundles" / sha
    if not _complete(folder):
        with locked():
            if not _complete(folder):  # another process may have unpacked it while we waited
                unpack(path, folder)
    return ResolvedBundle(read_bundle(folder / ZIP_ROOT), sha, "zip", source, pin is not None, sample=False)


# ----------------------------------------------------------------------------- locking

_held = threading.local()  # this thread's depth inside locked(): a nested call takes nothing


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """The data home's CORE lock (``<home>/core/.lock``), exclusive across processes and
    threads; re-entrant within a thread (a URL's download, then its unpack)."""
    depth = getattr(_held, "depth", 0)
    if depth:
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth = depth
        return
    path = data_home() / "core" / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:  # each call its own open file: flock excludes threads too
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        _held.depth = 1
        try:
            yield
        finally:
            _held.depth = 0
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _complete(folder: Path) -> bool:
    return (folder / ZIP_ROOT / CONFIG_FILE).is_file()


# ----------------------------------------------------------------------------- unpacking


def _member_path(info: zipfile.ZipInfo, archive: Path) -> PurePosixPath | None:
    """The member's safe relative path under ``eval_bundle/`` (None: outside it, skipped)."""
    name = info.filename
    parts = PurePosixPath(name).parts
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the zip records no Unix file type
    if name.startswith(("/", "\\")) or "\\" in name or ".." in parts or (parts and ":" in parts[0]):
        raise BundleError(f"{archive}: member {name!r} would be written outside the bundle folder; refusing the zip")
    if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
        raise BundleError(f"{archive}: member {name!r} is a link or special file; refusing the zip")
    if not parts or parts[0] != ZIP_ROOT:
        return None  # e.g. __MACOSX/: nanochat moves only eval_bundle/ out of the zip
    return PurePosixPath(*parts)


def unpack(archive: Path, folder: Path) -> None:
    """Unpack ``archive``'s ``eval_bundle/`` into ``folder`` (atomically, checked)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    temporary = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        with zipfile.ZipFile(archive) as zipped:
            infos = zipped.infolist()
            if len(infos) > MAX_MEMBERS:
                raise BundleError(f"{archive}: {len(infos):,} members, over the {MAX_MEMBERS:,} a bundle may have; refusing the zip")
            written = 0
            for info in infos:
                relative = _member_path(info, archive)
                if relative is None:
                    continue
                target = temporary.joinpath(*relative.parts)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                written = _copy_member(zipped, info, target, written, archive)
        if not (temporary / ZIP_ROOT / CONFIG_FILE).is_file():
            raise BundleError(f"{archive}: no {ZIP_ROOT}/{CONFIG_FILE} inside; a CORE bundle zip holds an {ZIP_ROOT}/ folder")
        if _complete(folder):
            return  # unpacked by another process meanwhile: keep it (it may be reading it)
        if folder.exists():
            shutil.rmtree(folder)  # an earlier, incomplete unpack (final name without core.yaml)
        os.replace(temporary, folder)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError) as exc:
        raise BundleError(f"{archive}: the zip cannot be read ({exc}); download it again") from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _copy_member(zipped: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, written: int, archive: Path) -> int:
    """Copy one member, counting the bytes actually produced (a header can lie)."""
    with zipped.open(info) as source, open(target, "wb") as sink:
        while block := source.read(1 << 20):
            written += len(block)
            if written > MAX_UNPACKED_BYTES:
                raise BundleError(f"{archive}: unpacks to more than {MAX_UNPACKED_BYTES >> 30} GiB; refusing the zip")
            sink.write(block)
    return written


# ----------------------------------------------------------------------------- downloads


@functools.lru_cache(maxsize=1)
def _project_prepare() -> ModuleType:
    """The project's own prepare.py, for its downloader (whichever prepare.py scores)."""
    path = default_prepare_path()
    spec = importlib.util.spec_from_file_location("trnf_project_prepare", path)
    if spec is None or spec.loader is None:
        raise TrnfError(f"{path} cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _from_url(url: str, pin: str | None) -> ResolvedBundle:
    with locked():  # one writer of the download (and its .partial) at a time
        path = _download(url)
        try:
            return _from_zip(path, url, pin)
        except TrnfError:
            path.unlink(missing_ok=True)  # not what was pinned (or unreadable): fetch afresh next time
            raise


def _download(url: str) -> Path:
    """``url`` into the data home (one file per URL; resumed, renamed in when complete)."""
    name = PurePosixPath(url.split("?", 1)[0]).name or "eval_bundle.zip"
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    dest = data_home() / "core" / "downloads" / f"{key}-{name}"
    prepare = _project_prepare()
    try:
        return Path(prepare.download_file(url, dest, valid=zipfile.is_zipfile, advice=DOWNLOAD_ADVICE))
    except prepare.PrepareError as exc:
        raise TrnfError(str(exc)) from None
