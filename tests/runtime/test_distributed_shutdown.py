"""Leaving a gloo process group does not abort the process at exit.

torch's gloo worker threads free a finished collective's tensors just after it completes,
which needs the GIL; a rank that reached interpreter shutdown first aborted ("terminate
called without an active exception") and torchrun then killed the ranks still working.
The script below makes that race as likely as it gets: its main thread keeps the GIL
(a 1 s switch interval) and exits right after its last all-reduce, of a tensor that
only the collective still holds. Without ``distributed.shutdown``'s settle, about half
of such runs aborted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gloo_ranks import assert_ranks_ok, run_ranks

# What makes the race: the last collective all-reduces a tensor only it still holds, and
# the script ends right after it (as the kit's evaluate_bpb does). Two ranks.
LAST_ALL_REDUCE = """
def final_total():
    totals = torch.ones(2, dtype=torch.float64)
    dist.all_reduce(totals)
    return float(totals[0])

assert final_total() == 2.0
"""

SCRIPT = """\
import sys
import torch
import torch.distributed as dist
from trnfrontier.runtime import distributed

sys.setswitchinterval(1.0)
info = distributed.dist_info()
device = torch.device("cpu")
distributed.init(device, info)
model = distributed.wrap(torch.nn.Linear(8, 8), device, info)
model(torch.randn(4, 8)).sum().backward()
""" + LAST_ALL_REDUCE + """\
distributed.shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(3))
def test_two_gloo_ranks_leave_and_exit_cleanly(round_: int, tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    assert_ranks_ok(run_ranks(script, 2))
