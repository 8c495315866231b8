"""The stub organisers' kit in tests/fixtures/kit/: where it is, and data for it.

``make_kit_cache(directory)`` writes a NEURON_COMPETITION_R1_CACHE_DIR the stub prepare.py
reads: ``data/shard_00000.parquet`` and ``data/shard_00001.parquet`` (training text) and
``data/shard_06542.parquet`` (validation), real English from the offline sample corpus
(the Python documentation that ships with the interpreter), a few hundred documents, and
``tokenizer/tokenizer.pkl`` unpacked from the stub's artifact (as its ``setup`` does).
``copy_kit(dest)`` copies the stub prepare.py, its tokenizer artifact and train.py into a
fresh directory (a team's checkout: the kit files side by side).
"""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

KIT_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "kit"
STUB_PREPARE = KIT_DIR / "prepare.py"
KIT_TRAIN_PY = KIT_DIR / "train.py"
TRAIN_DOCS, VAL_DOCS = 400, 120


def make_kit_cache(directory: Path, prepare_module) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    documents = [d for d in prepare_module.sample_documents() if len(d) > 400]
    data = directory / "data"
    data.mkdir(parents=True, exist_ok=True)
    split = {
        "shard_00000.parquet": documents[:TRAIN_DOCS // 2],
        "shard_00001.parquet": documents[TRAIN_DOCS // 2:TRAIN_DOCS],
        "shard_06542.parquet": documents[-VAL_DOCS:],
    }
    for name, texts in split.items():
        pq.write_table(pa.table({"text": texts}), data / name, row_group_size=32)
    # What `python prepare.py setup` does first: unpack the shipped tokenizer into the cache.
    with zipfile.ZipFile(KIT_DIR / "artifacts" / "tokenizer.zip") as archive:
        (directory / "tokenizer").mkdir(exist_ok=True)
        (directory / "tokenizer" / "tokenizer.pkl").write_bytes(archive.read("tokenizer.pkl"))
    return directory


def copy_kit(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(STUB_PREPARE, dest / "prepare.py")
    shutil.copytree(KIT_DIR / "artifacts", dest / "artifacts")
    shutil.copyfile(KIT_TRAIN_PY, dest / "train.py")
    return dest
