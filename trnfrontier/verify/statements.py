"""What an archive says of its own run's budget, beyond the step log: the budget check
honours every such statement (issue 26: a checkpoint whose own metadata said it ran over
budget passed the step-log check).

Read: ``logs/summary.json`` (and the kit's ``---`` block in it), ``checkpoint/meta.json``
and the ``meta`` inside ``checkpoint/final.pt`` (weights-only, mmap: no code runs and no
weights are read). ``logs/metrics.jsonl`` is the trainer log's (``contract.budget.trainer_log_charge``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trnfrontier import submission as fmt
from trnfrontier.contract.budget import over_budget_statement
from trnfrontier.contract.checkpoint import final_pt_meta
from trnfrontier.contract.jsonstrict import StrictJSONError, strict_loads
from trnfrontier.untrusted.hostfs import UnsafeFile, read_capped

# The kit's meta.json is a few hundred bytes; one larger than this is refused, not read.
META_JSON_BYTES = 1 << 20


class MetaJsonError(Exception):
    """``checkpoint/meta.json`` cannot be read as a JSON document; the message names the file and why."""


def read_meta_json(root: Path) -> Any:
    """``checkpoint/meta.json``'s document (None when absent: the manifest check names a missing
    member), or MetaJsonError: over ``META_JSON_BYTES``, not a regular file, not strict JSON. The
    checkpoint check refuses on it, so a statement of the budget in it is never silently lost."""
    try:
        data = read_capped(root, fmt.CHECKPOINT_META, META_JSON_BYTES)
    except FileNotFoundError:
        return None
    except (UnsafeFile, OSError) as exc:
        raise MetaJsonError(f"{exc}: what it says of the run's budget cannot be read") from None
    try:
        return strict_loads(data, what=fmt.CHECKPOINT_META)
    except StrictJSONError as exc:
        raise MetaJsonError(f"{exc}: what it says of the run's budget cannot be read") from None


def _meta_json(root: Path) -> Any:
    try:
        return read_meta_json(root)
    except MetaJsonError:
        return None  # refused by the checkpoint check (runner._checkpoint_check), which runs in every gate


def stated_over_budget(root: Path, summary: dict[str, Any], budget: float) -> str | None:
    """The first statement in the archive's own documents that the run went over
    ``budget`` (``over_budget: true``, or a charge above it), naming the member and the key."""
    documents = {
        fmt.SUMMARY: summary,
        fmt.CHECKPOINT_META: _meta_json(root),
        f"{fmt.CHECKPOINT_FINAL_PT} meta": final_pt_meta(fmt.member_path(root, fmt.CHECKPOINT_FINAL_PT)),
    }
    return over_budget_statement({k: v for k, v in documents.items() if v is not None}, budget)
