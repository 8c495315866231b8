"""Build artifacts/tokenizer.zip, the tokenizer the project's prepare.py ships and pins.

    python scripts/build_tokenizer_artifact.py            # write artifacts/tokenizer.zip, print its SHA256
    python scripts/build_tokenizer_artifact.py --check    # rebuild in memory; exit 1 unless byte-identical

The organisers' artifact is a BPE trained on ClimbMix; ClimbMix cannot be reached offline,
so ours is trained on the training split of the offline sample corpus (the Python
documentation that ships with the interpreter: ``prepare.sample_documents()``, the
documents that the 1-in-10 validation rule keeps for training, each capped like setup caps
them). Same vocabulary (8,192), same split pattern, the four specials at the top (BOS 8188).

The zip is deterministic: members stored (no compressor version in the bytes), in a fixed
order, with a fixed timestamp and mode. The training text depends on the Python
installation, so a rebuild is byte-identical on the same Python and rustbpe versions;
``provenance.json`` in the zip records them with the text's SHA256. After a rebuild that
changes the bytes, update ``TOKENIZER_ARTIFACT_SHA256`` in prepare.py.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
ARTIFACT = REPO / "artifacts" / "tokenizer.zip"
# A fixed member timestamp (zip stores local time without a zone; 1980 is the format's minimum).
FIXED_TIME = (2026, 1, 1, 0, 0, 0)


def load_prepare(path: Path = REPO / "prepare.py") -> ModuleType:
    """The project's prepare.py, loaded by path (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("trnf_prepare_for_artifact", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def training_texts(prepare: ModuleType) -> list[str]:
    """The sample corpus's training documents, capped per document as setup caps them."""
    return [d[:prepare.TOKENIZER_DOC_CAP_CHARS] for d in prepare.sample_documents() if not prepare._is_val_document(d)]


def zip_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """A zip of ``members`` whose bytes depend only on the members (stored, fixed metadata)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
            info.create_system = 3  # unix, whatever machine builds it
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_STORED
            archive.writestr(info, data)
    return buffer.getvalue()


def artifact_bytes(prepare: ModuleType, texts: list[str], vocab_size: int | None = None) -> bytes:
    """The artifact: ``tokenizer.pkl`` (prepare.py's format) and ``provenance.json``."""
    vocab = vocab_size or prepare.TOKENIZER_VOCAB_SIZE
    tokenizer = prepare.train_tokenizer(iter(texts), vocab)
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    provenance = {
        "corpus": "the Python documentation shipped with the interpreter (prepare.sample_documents(), training split)",
        "documents": len(texts),
        "text_sha256": digest.hexdigest(),
        "python": ".".join(str(part) for part in sys.version_info[:3]),
        "rustbpe": metadata.version("rustbpe"),
        "vocab_size": vocab,
        "special_tokens": list(prepare.SPECIAL_TOKENS),
    }
    return zip_bytes([(prepare.TOKENIZER_ARTIFACT_MEMBER, tokenizer),
                      ("provenance.json", json.dumps(provenance, indent=2, sort_keys=True).encode("utf-8") + b"\n")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="rebuild in memory and compare with the committed file and pin")
    parser.add_argument("--out", type=Path, default=ARTIFACT)
    args = parser.parse_args(argv)
    prepare = load_prepare()
    built = artifact_bytes(prepare, training_texts(prepare))
    sha = hashlib.sha256(built).hexdigest()
    if args.check:
        same = args.out.is_file() and args.out.read_bytes() == built
        pinned = sha == prepare.TOKENIZER_ARTIFACT_SHA256
        print(f"rebuilt SHA256 {sha}: {'identical to' if same else 'DIFFERS from'} {args.out}; "
              f"{'matches' if pinned else 'DIFFERS from'} prepare.TOKENIZER_ARTIFACT_SHA256")
        return 0 if same and pinned else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(built)
    print(f"wrote {args.out} ({len(built):,} bytes), SHA256 {sha}")
    if sha != prepare.TOKENIZER_ARTIFACT_SHA256:
        print(f"set TOKENIZER_ARTIFACT_SHA256 = \"{sha}\" in prepare.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
