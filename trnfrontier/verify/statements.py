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

# A meta.json larger than this is no meta.json (the gate's bounds keep the rest in check).
_META_BYTES = 1 << 20


def _meta_json(root: Path) -> Any:
    path = fmt.member_path(root, fmt.CHECKPOINT_META)
    try:
        if not path.is_file() or path.stat().st_size > _META_BYTES:
            return None
        return strict_loads(path.read_bytes(), what=fmt.CHECKPOINT_META)
    except (OSError, StrictJSONError):
        return None  # the checkpoint check reports an unreadable meta.json


def stated_over_budget(root: Path, summary: dict[str, Any], budget: float) -> str | None:
    """The first statement in the archive's own documents that the run went over
    ``budget`` (``over_budget: true``, or a charge above it), naming the member and the key."""
    documents = {
        fmt.SUMMARY: summary,
        fmt.CHECKPOINT_META: _meta_json(root),
        f"{fmt.CHECKPOINT_FINAL_PT} meta": final_pt_meta(fmt.member_path(root, fmt.CHECKPOINT_FINAL_PT)),
    }
    return over_budget_statement({k: v for k, v in documents.items() if v is not None}, budget)
