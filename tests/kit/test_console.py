"""What of torchrun's console a kit run shows live: the script's lines, not tracebacks or
torchrun's own reports (they stay in logs/console.log and the ranks' logs)."""

from __future__ import annotations

from trnfrontier.kit.console import ConsoleView
from trnfrontier.kit.logs import shorten

# What torchrun printed when every rank of a kit train.py failed on a CPU machine (abridged).
CONSOLE = """\
*****************************************
Setting OMP_NUM_THREADS environment variable for each process to be 1 in default
*****************************************
[default0]:step 00000 | loss 9.0101 | dt 0.93s
[default1]:[rank1]: Traceback (most recent call last):
[default0]:Traceback (most recent call last):
[default1]:[rank1]:   File "/team/train.py", line 5, in <module>
[default0]:  File "/team/train.py", line 5, in <module>
[default1]:[rank1]:     raise RuntimeError("no neuron device")
[default1]:[rank1]: RuntimeError: no neuron device
[default0]:    import torch_neuronx
[default0]:ModuleNotFoundError: No module named 'torch_neuronx'
[default0]:
[default0]:During handling of the above exception, another exception occurred:
[default0]:
[default0]:Traceback (most recent call last):
[default0]:  File "/team/train.py", line 9, in <module>
[default0]:RuntimeError: device 'neuron' is not available
W1201 23:43:16.758000 9336 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 9392 closing signal SIGTERM
E1201 23:43:16.957000 9336 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/team/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_23:43:16
  exitcode  : 1 (pid: 9392)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 9391)
============================================================
[default0]:a line after it all
"""


def test_the_console_shows_the_script_and_not_the_tracebacks() -> None:
    shown: list[str] = []
    view = ConsoleView(shown.append)
    for line in CONSOLE.splitlines():
        view(line)
    assert [line for line in shown if line.strip()] == [
        "*****************************************",
        "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default",
        "*****************************************",
        "[default0]:step 00000 | loss 9.0101 | dt 0.93s",
        "[default0]:a line after it all",
    ]


def test_a_long_error_line_is_cut_at_a_word_never_inside_one() -> None:
    line = "RuntimeError: " + " ".join(["word"] * 400)
    assert shorten("short line") == "short line"
    cut = shorten(line, 100)
    assert len(cut) <= 100 and cut.endswith(" word …") and cut.count("\n") == 0
