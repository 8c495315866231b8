"""The trusted contract: data, tokenizer, data loader, evaluation and the budget clock.

This file is what every score comes from, so it is standalone: the standard library,
numpy, torch, pyarrow, tiktoken and rustbpe, nothing of the trnf tool. Heavy modules are
imported lazily so that ``python prepare.py --help`` and ``import prepare`` are quick.

Command line:

    python prepare.py setup [--source climbmix|local|sample] [--path DIR] [--num-train-shards N]
                            [--tokenizer auto|shipped|trained] [--build-tokenizer-if-missing]
    python prepare.py eval-public --train-py PATH --checkpoint PATH [--tokens N] [--seq-len N]
                                  [--batch-size N] [--device cpu]

The surface a train.py may use is the organisers' (docs/kit-contract.md): the constants,
``Tokenizer``, ``ensure_tokenizer``, ``get_token_bytes``, ``get_dist_info``, ``print0``,
``make_dataloader``, ``_document_batches``, ``_row_groups_for_split``,
``record_step_boundary`` (0-based step index; ``$NEURON_COMPETITION_R1_STEP_LOG``),
``causality_check`` and ``evaluate_bpb``, with their signatures. The other names here are
what the trnf tool uses from its own copy; it never requires them from another prepare.py.

Data layout under ``$NEURON_COMPETITION_R1_CACHE_DIR``, else ``$TRNF_HOME`` (default
``~/.cache/trnfrontier``). ``data/`` and ``tokenizer/`` are where the organisers' kit keeps
its shards and unpacked tokenizer, so shards one prepare.py downloaded the other reuses::

    data/shard_00000.parquet ...        ClimbMix shards (`text` column); shard_06542 is validation
    tokenizer/tokenizer.pkl             unpacked from artifacts/tokenizer.zip (SHA256-pinned,
    tokenizer/token_bytes.pt              beside this file), with each token's byte length
    active                              the dataset name used when TRNF_DATASET is unset
    datasets/<name>/manifest.json       written last: a dataset without it is not trusted
    datasets/<name>/tokens/*.bin        uint16 token ids, each document starting with BOS
    datasets/<name>/shards/*.parquet    source text of --source local and sample
    datasets/<name>/tokenizer/          a tokenizer of the dataset's own (see TOKENIZER_CHOICES)

Bad input raises ``PrepareError`` (one line: what is wrong, where; what to do).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import re
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

# The process start the budget clock measures from (see record_step_boundary).
PROCESS_START_TIME = time.time()

# ---------------------------------------------------------------------------- constants

TRAIN_TIME_BUDGET_SECONDS = 1800
TRAIN_STARTUP_STEPS_EXCLUDED = 5
TRAIN_STARTUP_ALLOWANCE_CAP_SECONDS = 900
EVAL_TIMEOUT_SECONDS = 1200
TOKENIZER_VOCAB_SIZE = 8192
EVAL_SEQ_LEN = 1024
EVAL_TOKENS_PUBLIC = 2_097_152
EVAL_TOKENS_OFFICIAL = 20_971_520
VAL_SHARD = 6542

# The official runner's step-boundary log and the kit's data/tokenizer root.
STEP_LOG_ENV = "NEURON_COMPETITION_R1_STEP_LOG"
CACHE_DIR_ENV = "NEURON_COMPETITION_R1_CACHE_DIR"

# The tokenizer this file ships and pins, as the organisers' kit ships theirs: a zip in
# artifacts/ beside prepare.py (built by scripts/build_tokenizer_artifact.py). The kit's is
# a BPE trained on ClimbMix; ours is trained on the offline sample corpus (Python's
# documentation), the only text the project reaches offline. Same vocabulary and specials.
TOKENIZER_ARTIFACT = "artifacts/tokenizer.zip"
TOKENIZER_ARTIFACT_MEMBER = "tokenizer.pkl"
TOKENIZER_ARTIFACT_SHA256 = "00249cf456b31dea93a32845a97f76f9efe3b53ff7691a5f137075a33251d66f"
# Which tokenizer a dataset uses: shipped (the artifact), trained (a BPE of the dataset's
# own training text), auto (shipped for climbmix and sample, trained for local).
TOKENIZER_CHOICES = ("auto", "shipped", "trained")

SPECIAL_TOKENS = ("<|bos|>", "<|reserved_0|>", "<|reserved_1|>", "<|reserved_2|>")
BOS_TOKEN = SPECIAL_TOKENS[0]
# GPT-4's split pattern with numbers split into groups of at most two digits.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)

CLIMBMIX_URL_DEFAULT = "https://huggingface.co/datasets/karpathy/climbmix-400b-shuffle/resolve/main"
DEFAULT_NUM_TRAIN_SHARDS = 8
SOURCES = ("climbmix", "local", "sample")
# How --source local cuts .txt files into documents: auto merges blank-line paragraphs into
# ~4,000-character documents; line / paragraph / file keep a user's own documents exactly
# (one per non-empty line, per blank-line paragraph, per file); parquet reads only the
# `text` column of .parquet files (one document per row). .jsonl is one document per line.
DOCUMENT_RULES = ("auto", "line", "paragraph", "file", "parquet")
# Tokenizer training reads at most this much text (the first characters of each document).
TOKENIZER_MAX_CHARS = 1_000_000_000
TOKENIZER_DOC_CAP_CHARS = 10_000
# Stable train/validation split for local and sample documents: 1 in VAL_EVERY by CRC32.
VAL_EVERY = 10
SAMPLE_MIN_BYTES = 2_000_000
SAMPLE_MIN_DOCSTRING_CHARS = 50
MANIFEST_VERSION = 1

Progress = Callable[[str, int, "int | None", str], None]


class PrepareError(Exception):
    """Bad input or an unusable environment: one line saying what is wrong and what to do."""


# ---------------------------------------------------------------------------- paths


def trnf_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The data/cache root: ``home``, else ``$NEURON_COMPETITION_R1_CACHE_DIR`` (the kit's),
    else ``$TRNF_HOME``, else ``~/.cache/trnfrontier``."""
    chosen = home or os.environ.get(CACHE_DIR_ENV) or os.environ.get("TRNF_HOME") or "~/.cache/trnfrontier"
    return Path(chosen).expanduser().resolve()


def dataset_dir(name: str | None = None, home: str | os.PathLike[str] | None = None) -> Path:
    """The prepared dataset to read: ``name``, else ``$TRNF_DATASET``, else the ``active`` one."""
    root = trnf_home(home)
    chosen = name or os.environ.get("TRNF_DATASET")
    if not chosen:
        active = root / "active"
        if not active.is_file():
            raise PrepareError(
                f"no prepared dataset under {root} (no 'active' file); run `python prepare.py setup` or `trnf prepare`"
            )
        chosen = active.read_text(encoding="utf-8").strip()
    path = root / "datasets" / chosen
    if not (path / "manifest.json").is_file():
        raise PrepareError(
            f"dataset '{chosen}' is not prepared under {root / 'datasets'} (no manifest.json); "
            "run `python prepare.py setup` or `trnf prepare`"
        )
    return path


def load_manifest(path: Path | None = None) -> dict[str, Any]:
    """The manifest of a prepared dataset (default: the selected one)."""
    directory = path or dataset_dir()
    try:
        return json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PrepareError(f"{directory / 'manifest.json'} is unreadable ({exc}); rerun setup") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _repair_command(manifest: dict[str, Any]) -> str:
    """The command that rebuilds this dataset (what a damaged-file error tells the user)."""
    source = manifest.get("source", "climbmix")
    config = manifest.get("config") or {}
    # The choices that differ from the defaults, so the rerun rebuilds the same dataset.
    tokenizer = ""
    if source == "local" and "tokenizer_artifact_sha256" in config:
        tokenizer = " --tokenizer shipped"
    elif config.get("tokenizer") == "trained":
        tokenizer = " --tokenizer trained"
    if source == "local":
        extra = "".join(f" --{key.replace('_', '-')} {config[key]}" for key in ("val_path", "documents") if key in config)
        return f"trnf prepare --source local --path {config.get('path', 'DIR')}{extra}{tokenizer}"
    if source == "climbmix":
        return f"trnf prepare --num-train-shards {config.get('num_train_shards', DEFAULT_NUM_TRAIN_SHARDS)}{tokenizer}"
    return f"trnf prepare --source {source}{tokenizer}"


def check_token_file(directory: Path, entry: dict[str, Any], manifest: dict[str, Any], *, full: bool) -> None:
    """Refuse a token file whose size (always) or SHA256 (``full``) differs from the manifest.

    A truncated file would otherwise train on part of the data without a word (an even
    length) or fail inside numpy naming no file (an odd one)."""
    file = directory / entry["path"]
    repair = f"rerun `{_repair_command(manifest)}` to rebuild it"
    try:
        size = file.stat().st_size
    except OSError:
        raise PrepareError(f"token file {file} is missing; {repair}") from None
    if size != entry["size"]:
        raise PrepareError(f"token file {file} is damaged ({size:,} bytes, the manifest says {entry['size']:,}); {repair}")
    if full and "sha256" in entry and _sha256(file) != entry["sha256"]:
        raise PrepareError(f"token file {file} is damaged (its SHA256 differs from the manifest's); {repair}")


def verify_token_files(name: str | None = None, home: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Check every token file of a prepared dataset against its manifest: size and SHA256.

    What `trnf train` runs before it starts (a data loader checks sizes only, on every
    open). Returns ``{"dataset", "files", "bytes", "seconds"}``; raises PrepareError."""
    started = time.perf_counter()
    directory = dataset_dir(name, home)
    manifest = load_manifest(directory)
    check_tokenizer_current(directory, manifest)
    entries = manifest.get("token_files", [])
    for entry in entries:
        check_token_file(directory, entry, manifest, full=True)
    return {"dataset": directory.name, "files": len(entries), "bytes": sum(int(e["size"]) for e in entries),
            "seconds": time.perf_counter() - started}


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary name and rename, so a crash never leaves a half file trusted."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------- tokenizer


class Tokenizer:
    """A tiktoken Encoding built from rustbpe-trained ranks, with the specials at the top ids.

    ``sha256`` is what trnf records and pins for it: from ``ensure_tokenizer`` the dataset's
    ``tokenizer_pin`` (the shipped artifact's SHA256), from ``from_directory`` the file's."""

    def __init__(self, encoding: Any, sha256: str | None = None) -> None:
        self.enc = encoding
        self.sha256 = sha256
        self.bos_token_id = encoding.encode_single_token(BOS_TOKEN)

    @classmethod
    def from_pickle_bytes(cls, data: bytes, sha256: str | None = None) -> Tokenizer:
        import pickle

        import tiktoken

        spec = pickle.loads(data)
        encoding = tiktoken.Encoding(
            name=spec["name"],
            pat_str=spec["pattern"],
            mergeable_ranks=spec["mergeable_ranks"],
            special_tokens=spec["special_tokens"],
        )
        return cls(encoding, sha256=sha256)

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load ``tokenizer.pkl`` from a directory (a dataset's ``tokenizer/``)."""
        file = Path(path) / "tokenizer.pkl"
        if not file.is_file():
            raise PrepareError(f"no tokenizer at {file}; run `python prepare.py setup`")
        data = file.read_bytes()
        return cls.from_pickle_bytes(data, sha256=hashlib.sha256(data).hexdigest())

    def get_vocab_size(self) -> int:
        return self.enc.n_vocab

    def get_bos_token_id(self) -> int:
        return self.bos_token_id

    def get_special_tokens(self) -> set[str]:
        return set(self.enc.special_tokens_set)

    def is_special(self, token_id: int) -> bool:
        return token_id >= self.get_vocab_size() - len(SPECIAL_TOKENS)

    def encode_special(self, text: str) -> int:
        return self.enc.encode_single_token(text)

    def encode(self, docs: str | list[str], prepend: int | str | None = None, num_threads: int = 8) -> Any:
        """Ids of ``docs`` (a list of lists for a list), special tokens treated as plain text."""
        first = self.encode_special(prepend) if isinstance(prepend, str) else prepend
        if isinstance(docs, str):
            ids = self.enc.encode_ordinary(docs)
            return [first, *ids] if first is not None else ids
        batch = self.enc.encode_ordinary_batch(list(docs), num_threads=num_threads)
        if first is not None:
            batch = [[first, *ids] for ids in batch]
        return batch

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode(list(ids))

    def decode_single_token_bytes(self, token_id: int) -> bytes:
        return self.enc.decode_single_token_bytes(token_id)


def train_tokenizer(texts: Iterable[str], vocab_size: int = TOKENIZER_VOCAB_SIZE) -> bytes:
    """Train the BPE on ``texts`` and return the tokenizer file's bytes (deterministic).

    ``vocab_size`` counts the special tokens, which take the top ids.
    """
    import pickle

    import rustbpe

    learned = vocab_size - len(SPECIAL_TOKENS)
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(iter(texts), learned, pattern=SPLIT_PATTERN)
    ranks = sorted(trainer.get_mergeable_ranks(), key=lambda pair: pair[1])
    if len(ranks) < learned:
        raise PrepareError(
            f"the training text is too small for a vocabulary of {vocab_size}: only {len(ranks)} of "
            f"{learned} byte/merge tokens could be learned; give more text (a few MB at least)"
        )
    spec = {
        "name": f"trnf-bpe-{vocab_size}",
        "pattern": SPLIT_PATTERN,
        "mergeable_ranks": {token: rank for token, rank in ranks},
        "special_tokens": {name: learned + i for i, name in enumerate(SPECIAL_TOKENS)},
    }
    return pickle.dumps(spec, protocol=4)


def tokenizer_artifact_path() -> Path:
    """The tokenizer artifact this prepare.py ships beside itself."""
    return Path(__file__).resolve().parent / TOKENIZER_ARTIFACT


def read_tokenizer_artifact(path: str | os.PathLike[str] | None = None) -> tuple[bytes, str]:
    """(the tokenizer file inside the shipped artifact, the artifact's SHA256), after checking
    that SHA256 against ``TOKENIZER_ARTIFACT_SHA256``. A missing, unreadable or different
    artifact raises PrepareError."""
    import io
    import zipfile

    artifact = Path(path) if path is not None else tokenizer_artifact_path()
    # The one place to restore it from: git in a clone of the project; elsewhere (a team's
    # folder, a wheel) the artifacts/ folder that came with this file (`trnf init` copies both).
    clone = (artifact.parent.parent / ".git").exists()
    restore = ("restore it with `git checkout -- artifacts/`" if clone else
               "copy the artifacts/ folder that came with this prepare.py beside it (`trnf init DIR` copies both)")
    fix = f"{restore}, or pass --build-tokenizer-if-missing to train a tokenizer from the data instead"
    try:
        blob = artifact.read_bytes()
    except FileNotFoundError:
        raise PrepareError(f"tokenizer artifact {artifact} is missing; {fix}") from None
    except OSError as exc:
        raise PrepareError(f"tokenizer artifact {artifact} is unreadable ({exc.strerror or exc}); {fix}") from None
    digest = hashlib.sha256(blob).hexdigest()
    if digest != TOKENIZER_ARTIFACT_SHA256:
        raise PrepareError(f"tokenizer artifact {artifact} has SHA256 {digest}, but prepare.py pins "
                           f"{TOKENIZER_ARTIFACT_SHA256} (damaged or replaced); {fix}")
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            return archive.read(TOKENIZER_ARTIFACT_MEMBER), digest
    except (zipfile.BadZipFile, KeyError) as exc:  # only if the pin itself names a bad file
        raise PrepareError(f"tokenizer artifact {artifact} holds no readable {TOKENIZER_ARTIFACT_MEMBER} ({exc}); {fix}") from None


def tokenizer_pin(manifest: dict[str, Any]) -> str:
    """A prepared dataset's tokenizer identity: the SHA256 of the shipped artifact it was
    unpacked from (what trnf pins for a prepare.py with ``artifacts/tokenizer*.zip``),
    else the SHA256 of the dataset's own tokenizer file."""
    entry = manifest["tokenizer"]
    return str(entry.get("artifact_sha256") or entry["sha256"])


def ensure_tokenizer(build_if_missing: bool = False) -> Tokenizer:
    """The selected dataset's tokenizer. The file is checked against the SHA256 in the
    manifest before it is unpickled; ``Tokenizer.sha256`` is its pin (``tokenizer_pin``).
    ``build_if_missing``: with no prepared dataset, run ``setup()`` (training a tokenizer
    if the artifact is unusable) instead of failing."""
    try:
        directory = dataset_dir()
    except PrepareError:
        if not build_if_missing:
            raise
        setup(build_tokenizer_if_missing=True)
        directory = dataset_dir()
    manifest = load_manifest(directory)
    entry = manifest["tokenizer"]
    file = directory / entry["path"]
    repair = f"rerun `{_repair_command(manifest)}`"
    try:
        data = file.read_bytes()
    except OSError:
        raise PrepareError(f"the tokenizer of dataset {directory.name} is missing ({file}); {repair}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise PrepareError(f"{file} has SHA256 {digest}, the manifest says {entry['sha256']}; {repair}")
    check_tokenizer_current(directory, manifest)
    return Tokenizer.from_pickle_bytes(data, sha256=tokenizer_pin(manifest))


def check_tokenizer_current(directory: Path, manifest: dict[str, Any]) -> None:
    """Refuse a dataset whose tokenizer is not the one this prepare.py would give it now: one
    unpacked from another artifact than the pinned one, or a ClimbMix / sample dataset
    prepared before prepare.py shipped its artifact (its runs would record a tokenizer
    SHA256 that no pin accepts). A tokenizer trained on purpose (local, or
    --build-tokenizer-if-missing) is the dataset's own and stays valid."""
    entry = manifest["tokenizer"]
    repair = f"rerun `{_repair_command(manifest)}` (it reuses the downloaded shards)"
    shipped = entry.get("artifact_sha256")
    if shipped and shipped != TOKENIZER_ARTIFACT_SHA256:
        raise PrepareError(f"dataset {directory.name} was prepared with another tokenizer artifact (SHA256 {shipped}) "
                           f"than this prepare.py pins ({TOKENIZER_ARTIFACT_SHA256}); {repair}")
    if "origin" not in entry and manifest.get("source") in ("climbmix", "sample"):
        raise PrepareError(f"dataset {directory.name} was prepared by an older prepare.py, with a tokenizer of its own "
                           f"instead of the shipped artifact this one pins; {repair}")


def tokenizer_sha256() -> str:
    """The selected dataset's tokenizer pin (``tokenizer_pin``), as its manifest records it."""
    return tokenizer_pin(load_manifest())


def token_bytes_for(tokenizer: Tokenizer) -> Any:
    """int32 numpy array: byte length of every token id, 0 for special tokens."""
    import numpy as np

    size = tokenizer.get_vocab_size()
    out = np.zeros(size, dtype=np.int32)
    for token_id in range(size):
        if not tokenizer.is_special(token_id):
            out[token_id] = len(tokenizer.decode_single_token_bytes(token_id))
    return out


def get_token_bytes(device: Any = "cpu") -> Any:
    """int32 tensor [vocab]: byte length of each token, 0 for the special tokens."""
    import torch

    return torch.from_numpy(token_bytes_for(ensure_tokenizer())).to(device)


# ---------------------------------------------------------------------------- sources


def _is_val_document(text: str) -> bool:
    """Stable split rule for local and sample text: 1 in VAL_EVERY documents by CRC32."""
    return zlib.crc32(text.encode("utf-8")) % VAL_EVERY == 0


def sample_documents() -> list[str]:
    """Real English that ships with Python: the pydoc topics, then stdlib docstrings.

    Deterministic for one Python installation: sorted topics, sorted file traversal,
    docstrings in AST order, exact duplicates dropped. Test packages are skipped.
    """
    import ast
    import sysconfig

    documents: list[str] = []
    try:
        from pydoc_data.topics import topics

        documents.extend(topics[key].strip() for key in sorted(topics))
    except ImportError:  # some distributions strip pydoc_data; docstrings still exist
        pass
    skip_dirs = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for folder, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs)
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                tree = ast.parse(Path(folder, name).read_bytes())
            except (SyntaxError, ValueError, OSError):
                continue  # a file this interpreter cannot parse carries no usable docstrings
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) >= SAMPLE_MIN_DOCSTRING_CHARS:
                        documents.append(doc.strip())
    seen: set[str] = set()
    unique = [d for d in documents if d and not (d in seen or seen.add(d))]
    total = sum(len(d.encode("utf-8")) for d in unique)
    if total < SAMPLE_MIN_BYTES:
        raise PrepareError(
            f"this Python installation ({stdlib}) ships only {total} bytes of documentation text, "
            f"under the {SAMPLE_MIN_BYTES} the sample corpus needs; use --source local --path DIR"
        )
    return unique


def _read_text_file(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PrepareError(f"{path}: not UTF-8 (bad byte at offset {exc.start}); convert the file to UTF-8") from None


def _txt_documents(text: str, target_chars: int = 4000) -> list[str]:
    """Split a plain-text file at blank lines into documents of about ``target_chars``."""
    paragraphs = [p.strip() for p in text.replace("\r\n", "\n").split("\n\n")]
    documents, current, size = [], [], 0
    for paragraph in paragraphs:
        if not paragraph:
            continue
        current.append(paragraph)
        size += len(paragraph)
        if size >= target_chars:
            documents.append("\n\n".join(current))
            current, size = [], 0
    if current:
        documents.append("\n\n".join(current))
    return documents


def _parquet_texts(path: Path) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise PrepareError(f"{path}: not a readable parquet file ({exc})") from None
    if "text" not in parquet.schema_arrow.names:
        raise PrepareError(f"{path}: no `text` column (columns: {', '.join(parquet.schema_arrow.names)}); name the text column `text`")
    for index in range(parquet.num_row_groups):
        for text in parquet.read_row_group(index, columns=["text"]).column("text").to_pylist():
            if text:
                yield text


LOCAL_SUFFIXES = (".parquet", ".jsonl", ".txt")


def local_files(directory: Path, option: str = "--path") -> list[Path]:
    """The supported files at ``directory`` (a folder, searched recursively and sorted, or
    one file), or a clear error naming ``option``."""
    kinds = "a folder or file of .parquet, .jsonl or .txt"
    if not directory.exists():
        raise PrepareError(f"{option} {directory}: no such file or directory; give {kinds}")
    if directory.is_file():
        if directory.suffix not in LOCAL_SUFFIXES:
            raise PrepareError(f"{option} {directory}: not a .parquet, .jsonl or .txt file; give {kinds}")
        return [directory]
    if not directory.is_dir():
        raise PrepareError(f"{option} {directory}: not a regular file or directory; give {kinds}")
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES)
    if not files:
        raise PrepareError(f"{option} {directory}: no .parquet, .jsonl or .txt files in it")
    return files


def _txt_documents_by_rule(text: str, rule: str) -> list[str]:
    if rule == "auto":
        return _txt_documents(text)
    if rule == "file":  # the file's text exactly
        return [text] if text.strip() else []
    text = text.replace("\r\n", "\n")
    if rule == "line":
        return [line for line in text.split("\n") if line.strip()]
    if rule == "paragraph":
        return [p.strip("\n") for p in re.split(r"\n(?:[ \t]*\n)+", text) if p.strip()]
    raise PrepareError(f"--documents {rule}: unknown rule; choose one of {', '.join(DOCUMENT_RULES)}")


def local_documents(directory: Path, rule: str = "auto", files: list[Path] | None = None) -> Iterator[str]:
    """The documents of ``files`` (default: every supported file at ``directory``) cut by ``rule``."""
    for path in files if files is not None else local_files(directory):
        if rule == "parquet" and path.suffix != ".parquet":
            raise PrepareError(f"{path}: --documents parquet reads only .parquet files (a `text` column); pick another rule for .{path.suffix.lstrip('.')}")
        if path.suffix == ".parquet":
            yield from _parquet_texts(path)
        elif path.suffix == ".jsonl":
            for number, line in enumerate(_read_text_file(path).splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    raise PrepareError(f"{path}:{number}: not valid JSON; each line must be an object with a \"text\" string") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise PrepareError(f"{path}:{number}: no \"text\" string in this line; each line must be {{\"text\": ...}}")
                if record["text"]:
                    yield record["text"]
        else:
            yield from _txt_documents_by_rule(_read_text_file(path), rule)


def _write_parquet(path: Path, texts: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = path.with_name(path.name + ".partial")
    pq.write_table(pa.table({"text": pa.array(texts, type=pa.string())}), tmp, compression="zstd", row_group_size=1024)
    os.replace(tmp, path)


def _write_split_shards(shards: Path, documents: Iterable[str], docs_per_shard: int = 50_000,
                        val_documents: Iterable[str] | None = None) -> list[tuple[Path, str]]:
    """Write documents as parquet shards split train/public_val by the stable rule, or,
    when ``val_documents`` are given, every document of ``documents`` to train and every
    one of ``val_documents`` to public_val (a user's own split, kept exactly)."""
    shards.mkdir(parents=True, exist_ok=True)
    written: list[tuple[Path, str]] = []
    buffers: dict[str, list[str]] = {"train": [], "public_val": []}
    counts = {"train": 0, "public_val": 0}

    def flush(role: str) -> None:
        path = shards / f"{role}_{counts[role]:05d}.parquet"
        _write_parquet(path, buffers[role])
        written.append((path, role))
        buffers[role] = []
        counts[role] += 1

    if val_documents is None:
        roles: Iterable[tuple[str, str]] = (("public_val" if _is_val_document(t) else "train", t) for t in documents)
    else:
        roles = itertools.chain((("train", t) for t in documents), (("public_val", t) for t in val_documents))
    for role, text in roles:
        buffers[role].append(text)
        if len(buffers[role]) >= docs_per_shard:
            flush(role)
    for role in ("train", "public_val"):
        if buffers[role]:
            flush(role)
    for role in ("train", "public_val"):
        if counts[role] == 0:
            rule = f"1 in {VAL_EVERY} goes to validation" if val_documents is None else "--val-path gives the validation documents"
            raise PrepareError(f"the source has no {role} documents after the split ({rule}); give more documents")
    return written


# ---------------------------------------------------------------------------- downloads


class _Retry(Exception):
    """A download attempt that failed in a way worth retrying."""


def parquet_is_valid(path: Path) -> bool:
    """True when ``path`` has the PAR1 magic at both ends and pyarrow reads its footer."""
    try:
        size = path.stat().st_size
        if size < 12:
            return False
        with open(path, "rb") as handle:
            head = handle.read(4)
            handle.seek(size - 4)
            tail = handle.read(4)
        if head != b"PAR1" or tail != b"PAR1":
            return False
        import pyarrow.parquet as pq

        pq.read_metadata(path)
        return True
    except Exception:  # any failure to read the footer means "not a valid shard"
        return False


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.parquet"


def download_file(
    url: str,
    dest: Path,
    *,
    retries: int = 5,
    backoff: float | None = None,
    timeout: float = 60.0,
    on_bytes: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
    valid: Callable[[Path], bool] = parquet_is_valid,
    advice: str = "check the network or TRNF_CLIMBMIX_URL, or use --source sample",
) -> Path:
    """Download one file (a parquet shard by default) to ``dest``: Range-resume of
    ``dest.partial``, retries with exponential backoff, footer check before the atomic
    rename. A shard under its final
    name is always valid; a failure raises PrepareError. Other files (trnf's CORE bundle)
    pass their own ``valid`` check and the ``advice`` its errors end with."""
    import http.client
    import socket
    import urllib.error
    import urllib.request

    if dest.exists() and valid(dest):
        return dest
    base_delay = float(os.environ.get("TRNF_DOWNLOAD_BACKOFF", "1.0")) if backoff is None else backoff
    partial = dest.with_name(dest.name + ".partial")
    dest.parent.mkdir(parents=True, exist_ok=True)
    last_error = "no attempt made"
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(base_delay * 2 ** (attempt - 1))
        have = partial.stat().st_size if partial.exists() else 0
        headers = {"User-Agent": "trnf-prepare"}
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as response:
                total: int | None = None
                if response.status == 206:
                    content_range = response.headers.get("Content-Range", "")
                    start = int(content_range.split(" ")[1].split("-")[0]) if content_range.startswith("bytes ") else -1
                    if start != have:
                        raise _Retry(f"server resumed at byte {start}, expected {have}")
                    total = int(content_range.rsplit("/", 1)[1]) if not content_range.endswith("/*") else None
                    mode = "ab"
                else:
                    have, mode = 0, "wb"  # the server ignored the Range header: start over
                    length = response.headers.get("Content-Length")
                    total = int(length) if length else None
                if total is not None and on_total is not None:
                    on_total(total)
                with open(partial, mode) as handle:
                    while block := response.read(1 << 20):
                        if cancel is not None and cancel.is_set():
                            raise PrepareError(f"download of {url} cancelled; rerun setup to resume it")
                        handle.write(block)
                        if on_bytes is not None:
                            on_bytes(len(block))
            size = partial.stat().st_size
            if total is not None and size != total:
                raise _Retry(f"connection ended at byte {size} of {total}")
            if not valid(partial):
                partial.unlink(missing_ok=True)  # a complete but corrupt file: start over
                raise _Retry(f"the downloaded file is not a valid {dest.suffix.lstrip('.') or 'file'}")
            os.replace(partial, dest)
            return dest
        except urllib.error.HTTPError as exc:
            last_error = f"HTTP {exc.code}"
            if exc.code == 416:
                partial.unlink(missing_ok=True)
            elif 400 <= exc.code < 500 and exc.code not in (408, 429):
                raise PrepareError(f"{url}: HTTP {exc.code} {exc.reason}; {advice}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, socket.gaierror):
                raise PrepareError(f"cannot reach {url} ({exc.reason}); {advice}") from None
            last_error = str(exc.reason)
        except _Retry as exc:
            last_error = str(exc)
        except (http.client.HTTPException, ConnectionError, TimeoutError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
    raise PrepareError(
        f"could not download {url} after {retries + 1} attempts (last: {last_error}); rerun to resume, or {advice}"
    )


def download_shards(
    base_url: str,
    indices: list[int],
    directory: Path,
    *,
    workers: int = 8,
    retries: int = 5,
    backoff: float | None = None,
    progress: Progress | None = None,
) -> list[Path]:
    """Download shards in parallel; returns their paths in ``indices`` order."""
    from concurrent.futures import ThreadPoolExecutor

    lock = threading.Lock()
    counters = {"done": 0, "total": 0}

    def on_bytes(count: int) -> None:
        with lock:
            counters["done"] += count
            if progress:
                progress("download", counters["done"], counters["total"] or None, "B")

    def on_total(count: int) -> None:
        with lock:
            counters["total"] += count

    cancel = threading.Event()

    def fetch(index: int) -> Path:
        name = shard_name(index)
        return download_file(f"{base_url.rstrip('/')}/{name}", directory / name, retries=retries,
                             backoff=backoff, on_bytes=on_bytes, on_total=on_total, cancel=cancel)

    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(indices))))
    futures = [pool.submit(fetch, index) for index in indices]
    try:
        return [future.result() for future in futures]
    except BaseException:
        # One failure (or Ctrl-C) stops the others at their next block; what they wrote
        # stays as *.partial for the next run to resume.
        cancel.set()
        for future in futures:
            future.cancel()
        raise
    finally:
        pool.shutdown(wait=True)


# ---------------------------------------------------------------------------- setup


def _dataset_name(source: str, path: Path | None) -> str:
    return f"local-{path.name}" if source == "local" and path is not None else source


def _local_split(path: Path, val_path: Path | None) -> tuple[list[Path], list[Path] | None]:
    """(train files, validation files or None): files under ``val_path`` are validation
    only, even when they also lie under ``path``."""
    val_files = local_files(val_path, "--val-path") if val_path is not None else None
    train_files = [p for p in local_files(path) if val_files is None or p not in val_files]
    if not train_files:
        raise PrepareError(f"--path {path}: every file in it is a --val-path file; give training files too")
    return train_files, val_files


def _source_fingerprint(source: str, path: Path | None, num_train_shards: int,
                        val_path: Path | None = None, documents: str = "auto") -> dict[str, Any]:
    """What the prepared data depends on; a change means rebuild, not reuse."""
    if source == "climbmix":
        return {"source": source, "num_train_shards": num_train_shards,
                "base_url": os.environ.get("TRNF_CLIMBMIX_URL", CLIMBMIX_URL_DEFAULT)}
    if source == "local":
        assert path is not None
        train_files, val_files = _local_split(path, val_path)
        base = path if path.is_dir() else path.parent
        files = [[str(p.relative_to(base)), p.stat().st_size, p.stat().st_mtime_ns] for p in train_files]
        config: dict[str, Any] = {"source": source, "path": str(path), "files": files}
        # Only non-default choices are recorded, so datasets prepared before they existed are reused.
        if documents != "auto":
            config["documents"] = documents
        if val_path is not None and val_files is not None:
            config["val_path"] = str(val_path)
            config["val_files"] = [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in val_files]
        return config
    import sysconfig

    return {"source": source, "python": sys.version, "stdlib": sysconfig.get_paths()["stdlib"]}


def _reusable(directory: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest when everything it lists is present with the recorded size and SHA256."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if manifest.get("version") != MANIFEST_VERSION or manifest.get("config") != config:
        return None
    try:
        check_tokenizer_current(directory, manifest)
    except (PrepareError, KeyError):
        return None
    extra = [manifest["tokenizer"]["token_bytes"]] if "token_bytes" in manifest["tokenizer"] else []
    entries = [manifest["tokenizer"], *extra, *manifest["shards"], *manifest["token_files"]]
    for entry in entries:
        file = directory / entry["path"]
        if not file.is_file() or file.stat().st_size != entry["size"] or _sha256(file) != entry["sha256"]:
            return None
    return manifest


def _training_texts(shards: list[Path], on_chars: Callable[[int], None]) -> Iterator[str]:
    used = 0
    for shard in shards:
        for text in _parquet_texts(shard):
            piece = text[:TOKENIZER_DOC_CAP_CHARS]
            used += len(piece)
            on_chars(len(piece.encode("utf-8")))
            yield piece
            if used >= TOKENIZER_MAX_CHARS:
                return


def _tokenize_shard(tokenizer: Tokenizer, shard: Path, out: Path, on_bytes: Callable[[int], None],
                    num_threads: int = 8) -> dict[str, int | str]:
    """Write a shard's documents as uint16 ids (each preceded by BOS); returns counts and SHA256."""
    import itertools

    import numpy as np

    tmp = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    documents = tokens = text_bytes = 0
    bos = tokenizer.get_bos_token_id()
    batch: list[str] = []

    def flush(handle: Any) -> None:
        nonlocal documents, tokens, text_bytes
        encoded = tokenizer.encode(batch, num_threads=num_threads)
        count = sum(len(ids) for ids in encoded) + len(encoded)
        flat = np.fromiter(itertools.chain.from_iterable(itertools.chain((bos,), ids) for ids in encoded),
                           dtype=np.uint16, count=count)
        data = flat.tobytes()
        handle.write(data)
        digest.update(data)
        size = sum(len(t.encode("utf-8")) for t in batch)
        documents += len(batch)
        tokens += count
        text_bytes += size
        on_bytes(size)
        batch.clear()

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(tmp, "wb") as handle:
            for text in _parquet_texts(shard):
                batch.append(text)
                if len(batch) >= 4096:
                    flush(handle)
            if batch:
                flush(handle)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"documents": documents, "tokens": tokens, "bytes": text_bytes, "sha256": digest.hexdigest()}


def _text_size_estimate(shards: list[Path]) -> int:
    """Uncompressed size of the text columns (the tokenizing progress total)."""
    import pyarrow.parquet as pq

    total = 0
    for shard in shards:
        meta = pq.read_metadata(shard)
        for group in range(meta.num_row_groups):
            row_group = meta.row_group(group)
            for column in range(row_group.num_columns):
                if row_group.column(column).path_in_schema == "text":
                    total += row_group.column(column).total_uncompressed_size
    return total


def setup(
    source: str = "climbmix",
    path: str | os.PathLike[str] | None = None,
    num_train_shards: int = DEFAULT_NUM_TRAIN_SHARDS,
    home: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
    *,
    workers: int = 8,
    retries: int = 5,
    backoff: float | None = None,
    val_path: str | os.PathLike[str] | None = None,
    documents: str = "auto",
    tokenizer: str = "auto",
    build_tokenizer_if_missing: bool = False,
) -> dict[str, Any]:
    """Prepare a dataset (shards, tokenizer, token files, manifest) and make it active.

    ``--source local`` reads ``path`` (a folder or one file); ``val_path`` (a folder or
    file) gives the validation documents instead of the 1-in-10 hash split, and
    ``documents`` (DOCUMENT_RULES) how .txt files are cut into documents.

    ``tokenizer`` (TOKENIZER_CHOICES): ``shipped`` unpacks the SHA256-pinned artifact
    beside this file into ``<root>/tokenizer/``; ``trained`` trains a BPE on the dataset's
    training text; ``auto`` is shipped for climbmix and sample, trained for local. When the
    artifact is missing or fails its pin, setup stops, unless ``build_tokenizer_if_missing``
    (the kit's flag), which trains one instead and records why in the manifest. With a good
    artifact that flag changes nothing.

    ``progress(stage, done, total, unit)`` is called with stages ``download``,
    ``tokenizer`` and ``tokenize``. A second call with the same inputs verifies the
    files against the manifest and reuses them. Returns the summary (see ``summary``).
    """
    if source not in SOURCES:
        raise PrepareError(f"--source {source}: unknown source; choose one of {', '.join(SOURCES)}")
    local_path = Path(path).expanduser().resolve() if path is not None else None
    if source == "local" and local_path is None:
        raise PrepareError("--source local needs --path DIR (a folder of .parquet, .jsonl or .txt files)")
    if documents not in DOCUMENT_RULES:
        raise PrepareError(f"--documents {documents}: unknown rule; choose one of {', '.join(DOCUMENT_RULES)}")
    if source != "local" and (val_path is not None or documents != "auto"):
        raise PrepareError(f"--val-path and --documents apply to --source local, not --source {source}")
    local_val = Path(val_path).expanduser().resolve() if val_path is not None else None
    if source == "climbmix" and num_train_shards < 1:
        raise PrepareError(f"--num-train-shards {num_train_shards}: must be at least 1")
    choice = _tokenizer_choice(source, tokenizer, build_tokenizer_if_missing)
    report = progress or (lambda stage, done, total, unit: None)
    root = trnf_home(home)
    name = _dataset_name(source, local_path)
    directory = root / "datasets" / name
    config = _source_fingerprint(source, local_path, num_train_shards, local_val, documents)
    if choice.shipped is not None:
        config["tokenizer_artifact_sha256"] = choice.shipped[1]
    elif source != "local":  # a local dataset trains its own by default: nothing to record
        config["tokenizer"] = "trained"

    try:
        manifest = _reusable(directory, config)
        if manifest is None:
            manifest = _build(source, local_path, num_train_shards, directory, config, report, choice,
                              workers=workers, retries=retries, backoff=backoff)
            reused = False
        else:
            reused = True
        _mark_active(root, name)
    except OSError as exc:
        import errno

        if exc.errno == errno.ENOSPC:
            raise PrepareError(f"disk full while writing under {directory}; free space and rerun setup") from None
        raise
    result = summary(directory, manifest)
    result["reused"] = reused
    return result


class _TokenizerChoice:
    """Where a setup's tokenizer comes from: ``shipped`` = (artifact's tokenizer file, its
    SHA256), or None to train one; ``why`` says why one is trained instead of shipped."""

    def __init__(self, shipped: tuple[bytes, str] | None, why: str | None = None) -> None:
        self.shipped, self.why = shipped, why


def _tokenizer_choice(source: str, tokenizer: str, build_if_missing: bool) -> _TokenizerChoice:
    """Read and check the artifact up front, so a bad one stops setup before any download."""
    if tokenizer not in TOKENIZER_CHOICES:
        raise PrepareError(f"--tokenizer {tokenizer}: unknown; choose one of {', '.join(TOKENIZER_CHOICES)}")
    if tokenizer == "trained" or (tokenizer == "auto" and source == "local"):
        return _TokenizerChoice(None)
    try:
        return _TokenizerChoice(read_tokenizer_artifact())
    except PrepareError as exc:
        if not build_if_missing:
            raise
        return _TokenizerChoice(None, f"--build-tokenizer-if-missing: {exc}")


def _mark_active(root: Path, name: str) -> None:
    """Make ``name`` the active dataset, writing nothing when it already is: complete data
    on a read-only home (a shared, mounted cache) must stay usable."""
    active = root / "active"
    try:
        if active.read_text(encoding="utf-8").strip() == name:
            return
    except OSError:
        pass
    try:
        _atomic_write_bytes(active, (name + "\n").encode("utf-8"))
    except OSError as exc:
        import errno

        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            if os.environ.get("TRNF_DATASET") == name:
                return  # selected by the environment: the active file does not matter
            raise PrepareError(
                f"dataset '{name}' is complete but {root} is read-only, so it cannot be made the active one; "
                f"set TRNF_DATASET={name} to use it"
            ) from None
        raise


def _rel(path: Path, directory: Path) -> str:
    """``path`` as the manifest records it: relative to the dataset directory (``../../data/...``
    for the shared ClimbMix shards and tokenizer)."""
    return os.path.relpath(path, directory)


def _source_shards(source: str, local_path: Path | None, num_train_shards: int, directory: Path,
                   config: dict[str, Any], report: Progress, **download: Any) -> list[tuple[Path, str]]:
    """The dataset's parquet shards with their roles. ClimbMix shards go to the kit's
    ``<root>/data/`` (valid ones already there are kept, as are this project's older copies
    in ``datasets/climbmix/shards/``, moved there); local and sample ones to ``shards/``."""
    # Untrust the old dataset before the first file it lists changes: if anything below
    # fails, no manifest points at a mix. (Downloads only add shards, so they come first.)
    if source == "climbmix":
        data = directory.parent.parent / "data"
        indices = [*range(num_train_shards), VAL_SHARD]
        for index in indices:
            older, wanted = directory / "shards" / shard_name(index), data / shard_name(index)
            if not wanted.exists() and older.is_file() and parquet_is_valid(older):
                data.mkdir(parents=True, exist_ok=True)
                os.replace(older, wanted)
        paths = download_shards(config["base_url"], indices, data, progress=report, **download)
        (directory / "manifest.json").unlink(missing_ok=True)
        return [(p, "train") for p in paths[:-1]] + [(paths[-1], "public_val")]
    (directory / "manifest.json").unlink(missing_ok=True)
    shards_dir = directory / "shards"
    for stale in shards_dir.glob("*.parquet"):
        stale.unlink()
    if source == "sample":
        return _write_split_shards(shards_dir, sample_documents())
    assert local_path is not None
    rule = config.get("documents", "auto")
    val_path = Path(config["val_path"]) if "val_path" in config else None
    train_files, val_files = _local_split(local_path, val_path)
    val_docs = local_documents(local_path, rule, val_files) if val_files is not None else None
    return _write_split_shards(shards_dir, local_documents(local_path, rule, train_files), val_documents=val_docs)


def _place_tokenizer(data: bytes, folder: Path) -> tuple[Path, Tokenizer]:
    """Write ``tokenizer.pkl`` and ``token_bytes.pt`` (the kit's file names) into ``folder``."""
    import torch

    file = folder / "tokenizer.pkl"
    if not (file.is_file() and file.read_bytes() == data):
        _atomic_write_bytes(file, data)
    tokenizer = Tokenizer.from_pickle_bytes(data, sha256=hashlib.sha256(data).hexdigest())
    expected = torch.from_numpy(token_bytes_for(tokenizer))
    token_bytes = folder / "token_bytes.pt"
    try:  # kept when it holds the right values: other datasets' manifests record its SHA256
        keep = torch.equal(torch.load(token_bytes, weights_only=True), expected)
    except Exception:  # noqa: BLE001 - absent or unreadable: write it
        keep = False
    if not keep:
        tmp = token_bytes.with_name(token_bytes.name + ".partial")
        torch.save(expected, tmp)
        os.replace(tmp, token_bytes)
    return file, tokenizer


def _make_tokenizer(choice: _TokenizerChoice, train_shards: list[Path], directory: Path,
                    report: Progress) -> tuple[dict[str, Any], Tokenizer]:
    """The dataset's tokenizer and its manifest entry. The shipped one is unpacked into
    ``<root>/tokenizer/`` unless a different tokenizer is already there (the organisers'
    kit unpacked its own into the same data root): that one is left alone and ours goes
    into the dataset's own ``tokenizer/``. A trained one always goes there."""
    if choice.shipped is not None:
        data, artifact_sha256 = choice.shipped
        shared = directory.parent.parent / "tokenizer"
        foreign = (shared / "tokenizer.pkl").is_file() and _sha256(shared / "tokenizer.pkl") != hashlib.sha256(data).hexdigest()
        file, tokenizer = _place_tokenizer(data, directory / "tokenizer" if foreign else shared)
        origin: dict[str, Any] = {"origin": "shipped", "artifact": TOKENIZER_ARTIFACT, "artifact_sha256": artifact_sha256}
    else:
        total = min(_text_size_estimate(train_shards), TOKENIZER_MAX_CHARS)
        seen = [0]

        def on_chars(count: int) -> None:
            seen[0] += count
            report("tokenizer", min(seen[0], total), total, "B")

        report("tokenizer", 0, total, "B")
        data = train_tokenizer(_training_texts(train_shards, on_chars))
        report("tokenizer", total, total, "B")
        file, tokenizer = _place_tokenizer(data, directory / "tokenizer")
        origin = {"origin": "trained", **({"why": choice.why} if choice.why else {})}
    token_bytes = file.parent / "token_bytes.pt"
    entry = {"path": _rel(file, directory), "size": len(data), "sha256": tokenizer.sha256, **origin,
             "token_bytes": {"path": _rel(token_bytes, directory), "size": token_bytes.stat().st_size,
                             "sha256": _sha256(token_bytes)},
             "vocab_size": tokenizer.get_vocab_size(), "special_tokens": list(SPECIAL_TOKENS), "pattern": SPLIT_PATTERN}
    return entry, tokenizer


def _build(source: str, local_path: Path | None, num_train_shards: int, directory: Path, config: dict[str, Any],
           report: Progress, choice: _TokenizerChoice, **download: Any) -> dict[str, Any]:
    shards = _source_shards(source, local_path, num_train_shards, directory, config, report, **download)
    tokenizer_entry, tokenizer = _make_tokenizer(choice, [p for p, role in shards if role == "train"], directory, report)

    tokens_dir = directory / "tokens"
    for stale in tokens_dir.glob("*.bin"):
        stale.unlink()
    text_total = _text_size_estimate([p for p, _ in shards])
    done = [0]

    def on_bytes(count: int) -> None:
        done[0] += count
        report("tokenize", done[0], max(text_total, done[0]), "B")

    token_files, shard_entries, role_counts = [], [], {"train": 0, "public_val": 0}
    for shard, role in shards:
        out = tokens_dir / f"{role}_{role_counts[role]:05d}.bin"
        role_counts[role] += 1
        stats = _tokenize_shard(tokenizer, shard, out, on_bytes)
        token_files.append({"path": _rel(out, directory), "role": role, "size": out.stat().st_size, **stats})
        shard_entries.append({"path": _rel(shard, directory), "role": role, "size": shard.stat().st_size,
                              "sha256": _sha256(shard)})
    report("tokenize", done[0], done[0], "B")

    manifest = {
        "version": MANIFEST_VERSION,
        "name": directory.name,
        "source": source,
        "config": config,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tokenizer": tokenizer_entry,
        "shards": shard_entries,
        "token_files": token_files,
        "documents": sum(int(t["documents"]) for t in token_files),
        "bytes": sum(int(t["bytes"]) for t in token_files),
        "tokens": sum(int(t["tokens"]) for t in token_files),
    }
    _atomic_write_bytes(directory / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8"))
    return manifest


def summary(directory: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The numbers a person checks after setup. ``bytes_per_token`` excludes the BOS tokens."""
    content_tokens = manifest["tokens"] - manifest["documents"]
    by_role = {role: sum(int(t["tokens"]) for t in manifest["token_files"] if t["role"] == role)
               for role in ("train", "public_val")}
    return {
        "source": manifest["source"],
        "dataset": manifest["name"],
        "dataset_dir": str(directory),
        "manifest": str(directory / "manifest.json"),
        "documents": manifest["documents"],
        "bytes": manifest["bytes"],
        "tokens": manifest["tokens"],
        "train_tokens": by_role["train"],
        "public_val_tokens": by_role["public_val"],
        "bytes_per_token": manifest["bytes"] / content_tokens if content_tokens else 0.0,
        "tokenizer_sha256": tokenizer_pin(manifest),
        "tokenizer": manifest["tokenizer"].get("origin", "trained"),
        "tokenizer_path": os.path.normpath(directory / manifest["tokenizer"]["path"]),
    }


# ---------------------------------------------------------------------------- distributed


def get_dist_info() -> tuple[bool, int, int, int]:
    """(is_ddp, rank, local_rank, world_size) from the torchrun environment."""
    if all(key in os.environ for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        return True, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    return False, 0, 0, 1


def print0(*args: Any, **kwargs: Any) -> None:
    """print() on rank 0 only."""
    if get_dist_info()[1] == 0:
        print(*args, **kwargs)


# ---------------------------------------------------------------------------- token files


def _split_name(split: str) -> str:
    if split in ("val", "public_val"):
        return "public_val"
    if split == "train":
        return "train"
    raise PrepareError(f"split '{split}': unknown; use 'train' or 'public_val' ('val' is an alias)")


def _split_shards(split: str) -> list[Path]:
    """The selected dataset's parquet shards of a split, in manifest order."""
    directory = dataset_dir()
    role = _split_name(split)
    shards = [directory / entry["path"] for entry in load_manifest(directory)["shards"] if entry["role"] == role]
    if not shards:
        raise PrepareError(f"dataset {directory.name} has no {role} shards; rerun setup")
    return shards


def _shard_number(path: Path) -> int:
    digits = "".join(ch for ch in path.stem.rsplit("_", 1)[-1] if ch.isdigit())
    return int(digits) if digits else -1


def _row_groups_for_split(split: str, start: int, step: int, shard_ids: Iterable[int] | None = None) -> list[tuple[Path, int]]:
    """The (parquet file, row group) pairs of a split, every ``step``-th from ``start``.

    Ranks read disjoint row groups with ``start=rank, step=world_size``. ``shard_ids``
    keeps only the shards with those numbers (the digits of ``shard_00012.parquet``).
    """
    import pyarrow.parquet as pq

    if step < 1 or start < 0:
        raise PrepareError(f"start {start} and step {step}: start must be >= 0 and step >= 1")
    wanted = None if shard_ids is None else {int(i) for i in shard_ids}
    pairs = []
    for shard in _split_shards(split):
        if wanted is not None and _shard_number(shard) not in wanted:
            continue
        pairs.extend((shard, group) for group in range(pq.ParquetFile(shard).num_row_groups))
    return pairs[start::step]


def _document_batches(split: str, start: int, step: int, tokenizer_batch_size: int = 128,
                      shard_ids: Iterable[int] | None = None) -> Iterator[tuple[list[str], int]]:
    """Yield ``(list_of_document_strings, epoch)`` forever: the split's row groups from
    ``_row_groups_for_split``, in batches of ``tokenizer_batch_size``; epoch counts from 1."""
    import pyarrow.parquet as pq

    groups = _row_groups_for_split(split, start, step, shard_ids)
    if not groups:
        raise PrepareError(f"split '{split}' has no row groups for start {start}, step {step}")
    epoch = 1
    while True:
        for shard, group in groups:
            texts = pq.ParquetFile(shard).read_row_group(group, columns=["text"]).column("text").to_pylist()
            for first in range(0, len(texts), tokenizer_batch_size):
                yield texts[first:first + tokenizer_batch_size], epoch
        epoch += 1


def _token_arrays(split: str, tokenizer: Tokenizer | None = None) -> list[Any]:
    """Memory-mapped uint16 token files of a split of the selected dataset."""
    import numpy as np

    directory = dataset_dir()
    manifest = load_manifest(directory)
    expected = tokenizer_pin(manifest)
    if tokenizer is not None and getattr(tokenizer, "sha256", None) not in (None, expected):
        raise PrepareError(f"the tokenizer given does not match dataset {directory.name} (SHA256 differs); use ensure_tokenizer()")
    role = _split_name(split)
    arrays = []
    for entry in manifest["token_files"]:
        if entry["role"] == role and entry["tokens"]:
            check_token_file(directory, entry, manifest, full=False)
            arrays.append(np.memmap(directory / entry["path"], dtype=np.uint16, mode="r"))
    if not arrays:
        raise PrepareError(f"dataset {directory.name} has no {role} tokens; rerun setup")
    return arrays


# ---------------------------------------------------------------------------- data loader


class _DocumentStream:
    """Documents of one split in a fixed order, this rank's share: global index % world == rank."""

    def __init__(self, arrays: list[Any], bos: int, rank: int, world: int) -> None:
        import numpy as np

        self.arrays = arrays
        self.rank, self.world = rank, world
        self.starts, self.ends, offsets = [], [], [0]
        for array in arrays:
            starts = np.flatnonzero(np.asarray(array) == bos)
            if len(starts) == 0 or starts[0] != 0:
                starts = np.concatenate([[0], starts]).astype(np.int64)
            self.starts.append(starts)
            self.ends.append(np.concatenate([starts[1:], [len(array)]]))
            offsets.append(offsets[-1] + len(starts))
        self.offsets = offsets
        if offsets[-1] <= rank:
            raise PrepareError(f"rank {rank} of {world} gets no documents: the split has only {offsets[-1]}")

    def length(self, file: int, doc: int) -> int:
        return int(self.ends[file][doc] - self.starts[file][doc])

    def tokens(self, file: int, doc: int, count: int) -> Any:
        start = int(self.starts[file][doc])
        return self.arrays[file][start:start + count]

    def next_position(self, file: int, doc: int) -> tuple[int, int] | None:
        """The first position at or after (file, doc) that belongs to this rank, or None at the end."""
        while file < len(self.starts):
            first = self.offsets[file] + doc
            shift = (self.rank - first) % self.world
            if doc + shift < len(self.starts[file]):
                return file, doc + shift
            file, doc = file + 1, 0
        return None


class _PackingBuffer:
    """Buffered documents indexed for best-fit: the longest that fits the space left (the
    oldest of equal length), else the oldest of all (to be cropped)."""

    def __init__(self) -> None:
        import collections

        self.by_length: list[tuple[int, int]] = []  # sorted (length, arrival number)
        self.arrivals: Any = collections.deque()  # arrival numbers, oldest first; taken ones skipped lazily
        self.items: dict[int, tuple[int, int, int]] = {}  # arrival -> (file, doc, length)
        self.next_arrival = 0

    def __len__(self) -> int:
        return len(self.items)

    def add(self, file: int, doc: int, length: int) -> None:
        import bisect

        arrival = self.next_arrival
        self.next_arrival += 1
        self.items[arrival] = (file, doc, length)
        bisect.insort(self.by_length, (length, arrival))
        self.arrivals.append(arrival)

    def take(self, space: int) -> tuple[int, int, int]:
        import bisect

        fits = bisect.bisect_right(self.by_length, (space, math.inf)) - 1
        if fits >= 0:
            index = bisect.bisect_left(self.by_length, (self.by_length[fits][0], -1))
        else:
            while self.arrivals[0] not in self.items:
                self.arrivals.popleft()
            oldest = self.arrivals.popleft()
            index = bisect.bisect_left(self.by_length, (self.items[oldest][2], oldest))
        _, arrival = self.by_length.pop(index)
        if len(self.arrivals) > 4 * len(self.items) + 64:  # drop taken entries now and then
            self.arrivals = type(self.arrivals)(a for a in self.arrivals if a in self.items and a != arrival)
        return self.items.pop(arrival)

    def state(self) -> list[list[int]]:
        return [[self.items[a][0], self.items[a][1]] for a in self.arrivals if a in self.items]


def make_dataloader(
    tokenizer: Tokenizer,
    batch_size: int,
    seq_len: int,
    split: str,
    device: Any = "cpu",
    *,
    resume_state: dict[str, Any] | None = None,
    buffer_size: int = 1000,
    rank: int | None = None,
    world_size: int | None = None,
) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
    """Yield ``(inputs, targets, state)``: int32 inputs and int64 targets, [B, T], packed
    from whole documents (the organisers' dtypes: int32 ids feed the embedding, int64 the loss).

    Each row of T+1 tokens starts at a document's BOS. Documents are packed best-fit: the
    longest buffered document that fits the space left; when none fits, the oldest one is
    cropped to fill the row (so every document is used and the buffer never stalls). The
    train split loops over epochs; the validation split stops after one pass.
    ``state`` is JSON-serialisable; ``resume_state=state`` continues with the next batch.
    """
    import numpy as np
    import torch

    if batch_size < 1 or seq_len < 1:
        raise PrepareError(f"batch_size {batch_size} and seq_len {seq_len} must be positive")
    role = _split_name(split)
    _, dist_rank, _, dist_world = get_dist_info()
    rank = dist_rank if rank is None else rank
    world = dist_world if world_size is None else world_size
    stream = _DocumentStream(_token_arrays(role, tokenizer), tokenizer.get_bos_token_id(), rank, world)
    state = resume_state or {"epoch": 0, "file": 0, "doc": 0, "buffer": []}
    epoch, file, doc = int(state["epoch"]), int(state["file"]), int(state["doc"])
    buffer = _PackingBuffer()
    for f, d in state["buffer"]:
        buffer.add(int(f), int(d), stream.length(int(f), int(d)))
    row_len = seq_len + 1
    exhausted = False

    def refill() -> None:
        nonlocal epoch, file, doc, exhausted
        while len(buffer) < buffer_size and not exhausted:
            found = stream.next_position(file, doc)
            if found is None:
                if role != "train":
                    exhausted = True
                    return
                epoch, file, doc = epoch + 1, 0, 0
                continue
            buffer.add(found[0], found[1], stream.length(*found))
            file, doc = found[0], found[1] + 1

    use_pinned = torch.device(device).type == "cuda"
    while True:
        rows = np.empty((batch_size, row_len), dtype=np.int64)
        for row in range(batch_size):
            filled = 0
            while filled < row_len:
                refill()
                if not len(buffer):
                    return  # validation pass finished; a partial batch is dropped
                space = row_len - filled
                doc_file, doc_index, length = buffer.take(space)
                take = min(length, space)
                rows[row, filled:filled + take] = stream.tokens(doc_file, doc_index, take)
                filled += take
        batch = torch.from_numpy(rows)
        if use_pinned:
            batch = batch.pin_memory()
        batch = batch.to(device, non_blocking=use_pinned)
        state_out = {"epoch": epoch, "file": file, "doc": doc, "buffer": buffer.state()}
        yield batch[:, :-1].to(torch.int32), batch[:, 1:], state_out


# ---------------------------------------------------------------------------- evaluation


def _validation_stream(tokenizer: Tokenizer, split: str) -> Any:
    import numpy as np

    arrays = _token_arrays(split, tokenizer)
    return arrays[0] if len(arrays) == 1 else np.concatenate([np.asarray(a) for a in arrays])


def evaluate_bpb(
    model: Any,
    tokenizer: Tokenizer,
    batch_size: int,
    seq_len: int = EVAL_SEQ_LEN,
    device: Any = "cpu",
    split: str = "public_val",
    max_tokens: int = EVAL_TOKENS_PUBLIC,
    timeout_seconds: float = EVAL_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Bits per byte of ``model`` on the validation token stream.

    Rows are fixed windows of seq_len+1 tokens starting every seq_len tokens (every token
    after the first is a target once), at most ``max_tokens`` targets, row r on rank
    r % world. Cross-entropy is recomputed in float32 from ``model(x)`` logits, weighted by
    the byte length of each target (0-byte special tokens excluded), summed in float64 and
    across ranks. The token set does not depend on batch size.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F

    started = time.time()
    if batch_size < 1 or seq_len < 1:
        raise PrepareError(f"batch_size {batch_size} and seq_len {seq_len} must be positive")
    stream = _validation_stream(tokenizer, split)
    token_bytes = torch.from_numpy(token_bytes_for(tokenizer)).to(device)
    available_rows = (len(stream) - 1) // seq_len
    num_rows = min(max(1, max_tokens // seq_len), available_rows)
    if num_rows < 1:
        raise PrepareError(f"the {split} split has {len(stream)} tokens, fewer than one row of {seq_len + 1}")
    dist_ready = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if dist_ready else (0, 1)
    my_rows = list(range(rank, num_rows, world))

    total_nats = torch.zeros((), dtype=torch.float64, device=device)
    total_bytes = torch.zeros((), dtype=torch.float64, device=device)
    counted = torch.zeros((), dtype=torch.float64, device=device)
    over_timeout = False
    was_training = getattr(model, "training", False)
    model.eval()
    with torch.no_grad():
        for first in range(0, len(my_rows), batch_size):
            if time.time() - started > timeout_seconds:
                over_timeout = True
                break
            rows = np.stack([np.asarray(stream[r * seq_len:r * seq_len + seq_len + 1], dtype=np.int64)
                             for r in my_rows[first:first + batch_size]])
            batch = torch.from_numpy(rows).to(device)
            x, y = batch[:, :-1], batch[:, 1:]
            logits = model(x)
            if not isinstance(logits, torch.Tensor):
                raise TypeError(f"model(x) must return a logits tensor, got {type(logits).__name__}")
            nats = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
            weights = token_bytes[y.reshape(-1)]
            mask = weights > 0
            total_nats += nats[mask].double().sum()
            total_bytes += weights[mask].double().sum()
            counted += float(y.numel())
    if was_training:
        model.train()
    totals = torch.stack([total_nats, total_bytes, counted, torch.tensor(float(over_timeout), dtype=torch.float64, device=device)])
    if dist_ready:
        torch.distributed.all_reduce(totals)
    nats_sum, bytes_sum, count, timeouts = (float(v) for v in totals.cpu())
    # The kit's seven keys: num_tokens counts every target position scored (the requested
    # count when seq_len divides it), num_bytes and total_nats only byte-bearing targets.
    return {
        "val_bpb": nats_sum / (math.log(2) * bytes_sum) if bytes_sum else float("nan"),
        "total_nats": nats_sum,
        "num_tokens": int(count),
        "num_bytes": int(bytes_sum),
        "eval_seconds": time.time() - started,
        "eval_timeout": timeout_seconds,
        "eval_over_timeout": timeouts > 0,
    }


def causality_check(model: Any, tokenizer: Tokenizer, batch_size: int, seq_len: int, device: Any) -> dict[str, Any]:
    """Perturb the tokens from position t on; the logits before t must not change.

    ``batch_size`` random rows of ``seq_len`` tokens (a fixed seed), cut at the first, the
    middle and the last position. ``passed`` is False for a model that looks at future
    tokens; ``max_abs_diff`` is the largest change seen before a cut.
    """
    import torch

    vocab_size = tokenizer.get_vocab_size()
    rows, length = max(1, int(batch_size)), max(2, int(seq_len))
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab_size, (rows, length), generator=generator)
    was_training = getattr(model, "training", False)
    model.eval()
    worst = 0.0
    with torch.no_grad():
        base = model(x.to(device)).float().cpu()
        for cut in sorted({1, length // 2, length - 1}):
            changed = x.clone()
            shift = 1 + torch.randint(0, vocab_size - 1, x[:, cut:].shape, generator=generator)
            changed[:, cut:] = (x[:, cut:] + shift) % vocab_size
            other = model(changed.to(device)).float().cpu()
            worst = max(worst, float((base[:, :cut] - other[:, :cut]).abs().max()))
    if was_training:
        model.train()
    tolerance = 1e-5 * max(1.0, float(base.abs().max()))
    return {"passed": worst <= tolerance, "max_abs_diff": worst}


# ---------------------------------------------------------------------------- budget clock

_step_log_started: set[str] = set()


def _step_log_path(path: str | os.PathLike[str] | None = None) -> Path:
    """``path``, else ``$NEURON_COMPETITION_R1_STEP_LOG`` (the official runner's), else
    ``$TRNF_STEP_LOG``, else ``./step_boundaries.jsonl``."""
    chosen = path or os.environ.get(STEP_LOG_ENV) or os.environ.get("TRNF_STEP_LOG")
    return Path(chosen or "step_boundaries.jsonl")


def record_step_boundary(step: int) -> None:
    """Rank 0 appends ``{"step", "time"}`` after the optimizer step with 0-based index ``step``.

    The first call of a process appends a header line with the process start time; the
    budget clock reads the last such segment, so a rerun never mixes with an old log.
    """
    if get_dist_info()[1] != 0:
        return
    path = _step_log_path()
    key = str(path.resolve())
    lines = []
    if key not in _step_log_started or not path.exists():
        lines.append({"header": True, "start_time": PROCESS_START_TIME, "pid": os.getpid()})
        _step_log_started.add(key)
    lines.append({"step": int(step), "time": time.time()})
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(line) + "\n" for line in lines))


def budget_accounting(
    path: str | os.PathLike[str] | None = None,
    *,
    budget: float = TRAIN_TIME_BUDGET_SECONDS,
    steps_excluded: int = TRAIN_STARTUP_STEPS_EXCLUDED,
    cap: float = TRAIN_STARTUP_ALLOWANCE_CAP_SECONDS,
) -> dict[str, Any]:
    """The organisers' clock over the last run in a step log (0-based step indexes).

    startup = time from process start to the boundary of step index ``steps_excluded - 1``
    (steps 0-4 are startup: the clock starts when index 4 completes; all of the run when
    it has fewer steps); at most ``cap`` of it is excluded; charged = (last boundary -
    start) - excluded. ``steps`` = last index + 1, the number of completed steps.
    """
    log = _step_log_path(path)
    try:
        records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    except FileNotFoundError:
        raise PrepareError(f"no step log at {log}; record_step_boundary() writes it during training") from None
    except ValueError as exc:
        raise PrepareError(f"{log}: not a JSON-lines step log ({exc})") from None
    headers = [i for i, record in enumerate(records) if record.get("header")]
    if not headers:
        raise PrepareError(f"{log}: no header line with the process start time")
    start = float(records[headers[-1]]["start_time"])
    boundaries = [(int(r["step"]), float(r["time"])) for r in records[headers[-1] + 1:]]
    last = boundaries[-1][1] if boundaries else start
    after = [t for step, t in boundaries if step >= steps_excluded - 1]
    startup = (after[0] if after else last) - start
    excluded = min(startup, cap)
    charged = (last - start) - excluded
    return {
        "start_time": start,
        "steps": boundaries[-1][0] + 1 if boundaries else 0,
        "total_seconds": last - start,
        "startup_seconds": startup,
        "excluded_seconds": excluded,
        "charged_seconds": charged,
        "budget_seconds": budget,
        "headroom_seconds": budget - charged,
        "over_budget": charged > budget,
    }


# ---------------------------------------------------------------------------- command line


def _load_train_module(train_py: Path) -> Any:
    """Import train.py by path under a non-main name, so its ``__main__`` block does not run."""
    import importlib.util

    if not train_py.is_file():
        raise PrepareError(f"--train-py {train_py}: no such file")
    # train.py's own `import prepare` must get this module, not a second copy.
    sys.modules.setdefault("prepare", sys.modules[__name__])
    sys.path.insert(0, str(train_py.parent))
    spec = importlib.util.spec_from_file_location("trnf_submission_train", train_py)
    if spec is None or spec.loader is None:
        raise PrepareError(f"--train-py {train_py}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs: a top-level @dataclass under `from __future__ import
    # annotations` looks its module up in sys.modules while the class is created.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "load_for_eval", None)):
        raise PrepareError(f"{train_py} defines no load_for_eval(checkpoint_path, device)")
    return module


def eval_public(train_py: str, checkpoint: str, *, tokens: int = EVAL_TOKENS_PUBLIC, batch_size: int = 8,
                seq_len: int = EVAL_SEQ_LEN, device: str = "cpu") -> dict[str, Any]:
    """What ``python prepare.py eval-public`` prints: evaluate_bpb of the submission's model."""
    checkpoint_path = Path(checkpoint)
    if not checkpoint_path.exists():
        raise PrepareError(f"--checkpoint {checkpoint}: no such file")
    module = _load_train_module(Path(train_py).resolve())
    tokenizer = ensure_tokenizer()
    model = module.load_for_eval(str(checkpoint_path), device)
    # Exactly evaluate_bpb's seven keys, as the organisers' eval-public prints them.
    return evaluate_bpb(model, tokenizer, batch_size, seq_len, device, split="public_val", max_tokens=tokens,
                        timeout_seconds=EVAL_TIMEOUT_SECONDS)


def _print_progress(stage: str, done: int, total: int | None, unit: str) -> None:
    """Plain progress for the command line: one line per stage and 10% step."""
    if not total:
        return
    tenth = int(10 * done / total)
    key = (stage, tenth)
    if key not in _printed:
        _printed.add(key)
        sys.stderr.write(f"{stage}: {done / 1e6:.1f}/{total / 1e6:.1f} M{unit}\n")


_printed: set[tuple[str, int]] = set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="prepare.py", description="The trusted data, tokenizer and evaluation.")
    commands = parser.add_subparsers(dest="command", required=True)
    p_setup = commands.add_parser("setup", help="download or build the data and train the tokenizer")
    p_setup.add_argument("--source", choices=SOURCES, default="climbmix")
    p_setup.add_argument("--path", default=None, help="folder or file of .parquet/.jsonl/.txt (--source local)")
    p_setup.add_argument("--val-path", default=None, help="folder or file of validation documents (--source local; default: 1 in 10 by hash)")
    p_setup.add_argument("--documents", choices=DOCUMENT_RULES, default="auto", help="how .txt files are cut into documents (--source local)")
    p_setup.add_argument("--num-train-shards", type=int, default=DEFAULT_NUM_TRAIN_SHARDS)
    p_setup.add_argument("--tokenizer", choices=TOKENIZER_CHOICES, default="auto",
                         help="shipped: the SHA256-pinned artifacts/tokenizer.zip; trained: a BPE of the "
                              "dataset's own text; auto (default): shipped, but trained for --source local")
    p_setup.add_argument("--build-tokenizer-if-missing", action="store_true",
                         help="when the shipped artifact is missing or fails its SHA256 pin, train the "
                              "tokenizer from the training text instead of stopping (the kit's flag)")
    p_eval = commands.add_parser("eval-public", help="evaluate a submission's checkpoint on the public split")
    p_eval.add_argument("--train-py", required=True)
    p_eval.add_argument("--checkpoint", required=True)
    p_eval.add_argument("--tokens", "--eval-tokens", dest="tokens", type=int, default=EVAL_TOKENS_PUBLIC)
    p_eval.add_argument("--batch-size", type=int, default=8)
    p_eval.add_argument("--seq-len", type=int, default=EVAL_SEQ_LEN)
    p_eval.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    try:
        if args.command == "setup":
            result = setup(args.source, args.path, args.num_train_shards, progress=_print_progress,
                           val_path=args.val_path, documents=args.documents, tokenizer=args.tokenizer,
                           build_tokenizer_if_missing=args.build_tokenizer_if_missing)
        else:
            result = eval_public(args.train_py, args.checkpoint, tokens=args.tokens, batch_size=args.batch_size,
                                 seq_len=args.seq_len, device=args.device)
            # What was scored with, for the record (stdout carries only the result, as the kit's).
            sys.stderr.write(f"prepare.py: dataset {dataset_dir().name}, tokenizer SHA256 {tokenizer_sha256()}, "
                             f"prepare.py SHA256 {_sha256(Path(__file__))}\n")
    except PrepareError as exc:
        sys.stderr.write(f"prepare.py: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("prepare.py: interrupted; partial files were left as *.partial and are not trusted\n")
        return 130
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    # `python prepare.py` runs as __main__; register it as `prepare` so train.py imports this copy.
    sys.modules.setdefault("prepare", sys.modules[__name__])
    sys.exit(main())
