"""Reading what a kit train.py printed: step lines, parameter counts, rank logs, the failing rank."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trnfrontier.kit import logs


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("step 12 | loss 3.2100 | lr 0.001 | 12,345 tok/s | mfu 30.1% | charged 123.4/1800 s",
         {"step": 12, "loss": 3.21, "lr": 0.001, "tokens_per_second": 12345.0, "mfu": 0.301}),
        ("[default0]:step:12/100 train_loss:3.2100 train_time:1234ms step_avg:102.83ms", {"step": 12, "loss": 3.21}),
        ("step 00012/01000 (1.2%) | loss: 3.210000 | lrm: 1.00 | dt: 123.45ms | tok/sec: 12,345 | mfu: 30.00",
         {"step": 12, "loss": 3.21, "tokens_per_second": 12345.0, "mfu": 0.30}),
        ("step 5, loss 2.5, lr 1e-3, tokens 20480", {"step": 5, "loss": 2.5, "lr": 1e-3, "tokens": 20480}),
        ("[rank1]:step=7 val_bpb=1.2345", {"step": 7, "val_bpb": 1.2345}),
    ],
)
def test_usual_step_lines(line: str, expected: dict) -> None:
    assert logs.parse_step_line(line) == pytest.approx(expected)


@pytest.mark.parametrize("line", ["steps: 4", "step_boundaries.jsonl written", "loss 3.2", "Stepping up", ""])
def test_other_lines_are_not_steps(line: str) -> None:
    assert logs.parse_step_line(line) is None


def test_nan_loss_is_found(tmp_path: Path) -> None:
    out = tmp_path / "rank0.stdout.log"
    out.write_text("Number of parameters: 59,604,992\nstep 1 | loss 9.1\nstep 2 | loss nan\nstep 3 | loss inf\n")
    printed = logs.read_printed([out, tmp_path / "absent.log"])
    assert printed.params == 59_604_992
    assert [r["step"] for r in printed.records] == [1, 2, 3]
    assert math.isnan(printed.records[1]["loss"])
    assert printed.non_finite_loss_step() == 2


def test_lines_of_one_step_merge_into_one_record(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    out.write_text("step 8 | loss 2.5\nstep 8 | val_bpb 1.7\nstep 9 | loss 2.4\n")
    printed = logs.read_printed([out])
    assert printed.records == [{"step": 8, "loss": 2.5, "val_bpb": 1.7}, {"step": 9, "loss": 2.4}]
    assert printed.last("val_bpb") == 1.7 and printed.last("tokens") is None


@pytest.mark.parametrize(("text", "count"), [("params 59.6M", 59_600_000), ("model has 1,234 parameters", 1234), ("num_params=262_400", 262_400)])
def test_parameter_counts(text: str, count: int) -> None:
    assert logs.parse_params([text]) == count


def _torchrun_layout(root: Path, ranks: int) -> Path:
    torchrun = root / "torchrun"
    for rank in range(ranks):
        d = torchrun / "abc_123" / "attempt_0" / str(rank)
        d.mkdir(parents=True)
        (d / "stdout.log").write_text(f"step 1 | loss 1.0 | rank {rank}\n")
        (d / "stderr.log").write_text("" if rank == 0 else "Traceback (most recent call last):\nValueError: bad\n")
    return torchrun


def test_rank_logs_move_to_flat_names(tmp_path: Path) -> None:
    torchrun = _torchrun_layout(tmp_path, 2)
    found = logs.collect_rank_logs(torchrun, tmp_path / "logs")
    assert sorted(found) == [0, 1]
    assert found[1].stderr == tmp_path / "logs" / "rank1.stderr.log"
    assert "rank 1" in found[1].stdout.read_text()
    assert not torchrun.exists()


CONSOLE = """\
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 14553)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 14554)
"""


def test_failing_rank_is_torchruns_root_cause_else_the_first_traceback(tmp_path: Path) -> None:
    found = logs.collect_rank_logs(_torchrun_layout(tmp_path, 3), tmp_path / "logs")
    assert logs.failing_rank(CONSOLE, found) == 1
    assert logs.failing_rank("no summary printed", found) == 1
    assert logs.failing_rank("", {0: found[0]}) is None


def test_a_rank_broken_by_its_dead_peer_is_not_the_cause(tmp_path: Path) -> None:
    """Under load torchrun may observe rank 0 (whose all-reduce broke) before rank 1 (which raised)."""
    found = logs.collect_rank_logs(_torchrun_layout(tmp_path, 2), tmp_path / "logs")
    found[0].stderr.write_text(
        "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
        "torch.distributed.DistBackendError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer\n"
    )
    rank0_first = CONSOLE.replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
    assert logs.failing_rank(rank0_first, found) == 1
    # with only collateral tracebacks, torchrun's root cause still decides
    found[1].stderr.write_text(found[0].stderr.read_text())
    assert logs.failing_rank(rank0_first, found) == 0


def test_failure_shows_the_failing_ranks_log_else_the_console(tmp_path: Path) -> None:
    found = logs.collect_rank_logs(_torchrun_layout(tmp_path, 3), tmp_path / "logs")
    console = tmp_path / "logs" / "console.log"
    console.write_text("[default0]: step 1\ntorchrun: ChildFailedError\n")
    assert logs.failure(CONSOLE, found, console) == (1, found[1].stderr, ["Traceback (most recent call last):", "ValueError: bad"])
    assert logs.failure("", {0: found[0]}, console) == (None, console, ["[default0]: step 1", "torchrun: ChildFailedError"])
    found[1].stderr.write_text("")  # nothing on stderr: the rank's stdout tells what it did last
    assert logs.failure(CONSOLE, found, console) == (1, found[1].stderr, ["step 1 | loss 1.0 | rank 1"])


def test_error_line_and_tail(tmp_path: Path) -> None:
    lines = ["[rank1]: Traceback (most recent call last):", '[rank1]:   raise RuntimeError("x")', "[rank1]: RuntimeError: injected", ""]
    assert logs.last_error_line(lines) == "RuntimeError: injected"
    assert logs.last_error_line(["just text"]) == "just text"
    log = tmp_path / "err.log"
    log.write_text("\n".join(f"line {i}" for i in range(30)) + "\n\n")
    assert logs.tail(log, 3) == ["line 27", "line 28", "line 29"]
    assert logs.tail(tmp_path / "missing.log") == []


# ---------------------------------------------------------------------------- an abort at exit

# What rank 1 of a 2-rank gloo run printed (torch 2.13, CPU, faulthandler on) when torch's
# gloo worker freed the final all-reduce's tensor after the interpreter began shutting down.
GLOO_EXIT_ABORT = """\
terminate called without an active exception
Fatal Python error: Aborted

Thread 0x00007f9cf8a3eb80 (most recent call first):
  <no Python frame>

Extension modules: numpy._core._multiarray_umath, torch._C, torch._C._nn (total: 3)
"""

TORCHRUN_AFTER = """\
W1130 17:40:04.383000 10386 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 10392 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  exitcode  : -6 (pid: 10393)  (SIGABRT)
"""

# The same abort while the script still ran: the main thread has a Python frame.
ABORT_MID_RUN = """\
terminate called without an active exception
Fatal Python error: Aborted

Current thread 0x00007f3873fe0b80 (most recent call first):
  File "/team/train.py", line 88 in main
  File "/team/train.py", line 120 in <module>
"""


@pytest.mark.parametrize("text", [
    GLOO_EXIT_ABORT,
    "step 7 | val_bpb 2.96\n" + GLOO_EXIT_ABORT + TORCHRUN_AFTER,  # a console holding it
    "".join(f"[default1]:{line}\n" for line in GLOO_EXIT_ABORT.splitlines()),  # torchrun --tee
    GLOO_EXIT_ABORT.replace("Thread 0x", "Current thread 0x"),  # the main thread aborted
    # faulthandler crashed on a thread being torn down, mid-header (seen in CI) or after one
    GLOO_EXIT_ABORT.replace("Thread 0x00007f9cf8a3eb80 (most recent call first):\n  <no Python frame>",
                            "Thread 0xFatal Python error: Segmentation fault"),
    GLOO_EXIT_ABORT.replace("  <no Python frame>\n", "  <no Python frame>\n\nThread 0x1 (most recent call first):\n"
                            "Fatal Python error: Segmentation fault\n"),
])
def test_an_abort_after_the_script_finished_is_recognised(text: str) -> None:
    assert logs.aborted_after_finishing(text)


@pytest.mark.parametrize("text", [
    ABORT_MID_RUN,
    # a second thread still in Python code
    GLOO_EXIT_ABORT.replace("  <no Python frame>\n", '  <no Python frame>\n\nThread 0x1 (most recent call first):\n  File "x.py", line 3 in f\n'),
    GLOO_EXIT_ABORT.replace("without an active exception", "after throwing an instance of 'gloo::EnforceNotMet'"),
    # faulthandler showed a Python frame before it crashed
    ABORT_MID_RUN + "Fatal Python error: Segmentation fault\n",
    "terminate called without an active exception\n",  # no faulthandler dump: nothing tells when
    # the script raised, then the interpreter shut down and aborted the same way
    "Traceback (most recent call last):\n  File \"train.py\", line 3\nRuntimeError: injected\n" + GLOO_EXIT_ABORT,
    "Traceback (most recent call last):\n  File \"train.py\", line 3\nRuntimeError: boom\n",
    "",
])
def test_any_other_abort_or_crash_is_not(text: str) -> None:
    assert not logs.aborted_after_finishing(text)


def test_the_failing_rank_is_named_only_when_its_own_log_shows_the_abort_at_exit(tmp_path: Path) -> None:
    found = logs.collect_rank_logs(_torchrun_layout(tmp_path, 3), tmp_path / "logs")
    assert logs.rank_aborted_after_finishing(CONSOLE, found) is None  # rank 1 raised
    found[1].stderr.write_text(GLOO_EXIT_ABORT)
    assert logs.rank_aborted_after_finishing(CONSOLE, found) == 1
    rank0 = CONSOLE.replace("rank      : 1 (local_rank: 1)", "rank      : 0 (local_rank: 0)")
    assert logs.rank_aborted_after_finishing(rank0, found) is None  # rank 0's log shows no abort
    found[0].stderr.write_text(GLOO_EXIT_ABORT)
    found[1].stderr.write_text("")
    assert logs.rank_aborted_after_finishing(rank0, found) == 0
    assert logs.rank_aborted_after_finishing("", {}) is None
