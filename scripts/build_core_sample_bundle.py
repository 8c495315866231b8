"""Build artifacts/core_sample_bundle.zip, trnf's CORE format sample (a score on it means nothing).

    python scripts/build_core_sample_bundle.py            # write the zip, print its SHA256
    python scripts/build_core_sample_bundle.py --check    # rebuild in memory; exit 1 unless byte-identical

The real CORE bundle (nanochat's ``eval_bundle.zip``) is not the project's to ship. This
one has exactly its format (an ``eval_bundle/`` folder with ``core.yaml``,
``eval_meta_data.csv`` and ``eval_data/<category>/<task>.jsonl``) and tasks of all three
types shaped like real ones (``core_sample_items.py``: hand-written items about Python),
so that tests, the demo and the benchmark run offline. Its README, its task labels
(``sample_*``) and its metadata say it is a format sample. The zip is deterministic
(``build_tokenizer_artifact.zip_bytes``); after a change, update
``SAMPLE_BUNDLE_SHA256`` in ``trnfrontier/evaluate/core/fetch.py``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import re
import sys
from pathlib import Path

from build_tokenizer_artifact import zip_bytes
from core_sample_items import TASKS

REPO = Path(__file__).resolve().parents[1]
ARTIFACT = REPO / "artifacts" / "core_sample_bundle.zip"
PIN_FILE = REPO / "trnfrontier" / "evaluate" / "core" / "fetch.py"
ROOT = "eval_bundle"
README = """\
trnf CORE format sample
=======================

A FORMAT SAMPLE, NOT THE CORE BENCHMARK: a score on these tasks means nothing.

This folder has exactly the layout of nanochat's CORE eval bundle (core.yaml,
eval_meta_data.csv, eval_data/<category>/<task>.jsonl), with a few hand-written items per
task about Python, each task shaped like a real CORE task (named in eval_meta_data.csv).
It lets trnf's tests, demo and benchmark run offline. Score a model on the real bundle
with `trnf eval RUN --core --bundle URL --bundle-sha256 SHA256`.
"""


def core_yaml() -> str:
    lines = ["# trnf CORE format sample: the real bundle's layout; a score on it means nothing.", "icl_tasks:"]
    for label, (folder, _items, kind, shots, delimiter, *_rest) in TASKS.items():
        lines += ["-", f"  label: {label}", f"  dataset_uri: {folder}/{label}.jsonl", f"  num_fewshot: [{shots}]", f"  icl_task_type: {kind}"]
        if delimiter is not None:
            lines.append(f"  continuation_delimiter: {json.dumps(delimiter)}")
    return "\n".join(lines) + "\n"


def meta_csv() -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["Eval Task", "Task Category", "Task Type", "#shots", "#datapoints", "Random baseline", "Centered Metric?", "Description"])
    for label, (_folder, items, kind, shots, _delimiter, baseline, category, mirrors) in TASKS.items():
        kind_name = re.sub("_", " ", kind)
        description = f"trnf format sample shaped like {mirrors}; hand-written items about Python; the score means nothing"
        writer.writerow([label, category, kind_name, shots, len(items), f"{baseline:g}", "Yes", description])
    return buffer.getvalue()


def bundle_bytes() -> bytes:
    members = [(f"{ROOT}/", b""), (f"{ROOT}/README.md", README.encode()), (f"{ROOT}/core.yaml", core_yaml().encode()),
               (f"{ROOT}/eval_meta_data.csv", meta_csv().encode()), (f"{ROOT}/eval_data/", b"")]
    folders = sorted({folder for folder, *_ in TASKS.values()})
    members += [(f"{ROOT}/eval_data/{folder}/", b"") for folder in folders]
    for label, (folder, items, *_rest) in TASKS.items():
        text = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
        members.append((f"{ROOT}/eval_data/{folder}/{label}.jsonl", text.encode("utf-8")))
    return zip_bytes(members)


def pinned_sha256() -> str | None:
    found = re.search(r'SAMPLE_BUNDLE_SHA256 = "([0-9a-f]{64})"', PIN_FILE.read_text(encoding="utf-8"))
    return found.group(1) if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="rebuild in memory and compare with the committed file and pin")
    parser.add_argument("--out", type=Path, default=ARTIFACT)
    args = parser.parse_args(argv)
    built = bundle_bytes()
    sha = hashlib.sha256(built).hexdigest()
    pinned = sha == pinned_sha256()
    if args.check:
        same = args.out.is_file() and args.out.read_bytes() == built
        print(f"rebuilt SHA256 {sha}: {'identical to' if same else 'DIFFERS from'} {args.out}; "
              f"{'matches' if pinned else 'DIFFERS from'} SAMPLE_BUNDLE_SHA256 in {PIN_FILE.name}")
        return 0 if same and pinned else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(built)
    print(f"wrote {args.out} ({len(built):,} bytes), SHA256 {sha}")
    if not pinned:
        print(f'set SAMPLE_BUNDLE_SHA256 = "{sha}" in {PIN_FILE}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
