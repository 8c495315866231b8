"""A failed verify dry run says why (the worker's exception, not torchrun's banner) and names its log."""

from __future__ import annotations

from pathlib import Path

import pytest
from verify_kit import step_log

from trnfrontier.runtime.rundir import STEP_LOG_FILE
from trnfrontier.verify import dryrun

TORCHRUN_TAIL = """
[rank0]: Traceback (most recent call last):
[rank0]:   File "/work/run/train.py", line 12, in <module>
[rank0]:     raise RuntimeError("boom at step 2")
[rank0]: RuntimeError: boom at step 2
E1130 12:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 42)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_the_error_line_is_the_workers_exception() -> None:
    assert dryrun.error_line(TORCHRUN_TAIL) == "RuntimeError: boom at step 2"
    assert dryrun.error_line("just a line\n") == "just a line"


def test_a_failed_dry_run_keeps_its_output_tail_in_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "archive"
    root.mkdir()
    (root / "train.py").write_text("raise RuntimeError('boom at step 2')\n")
    monkeypatch.setattr(dryrun, "build_clean_env", lambda work, prepare: work / "venv" / "bin" / "python")
    monkeypatch.setattr(dryrun.sandbox, "run_confined", lambda *a, **k: dryrun.sandbox.Finished(1, TORCHRUN_TAIL))
    work = tmp_path / "work"
    work.mkdir()
    result = dryrun.dry_run(root, ["train.py"], work, nproc=1, lnc=2, prepare=None, steps=3, timeout=60)
    assert not result.passed
    assert "RuntimeError: boom at step 2" in result.reason and "=====" not in result.reason
    assert "ChildFailedError" in result.output  # the tail is kept for the report's notes; no file is left anywhere


def test_torchruns_closing_report_is_never_the_reason() -> None:
    assert dryrun.error_line("[rank0]: SystemExit: 3\n" + TORCHRUN_TAIL.split("E1130")[1]) == "SystemExit: 3"
    banner_only = "train.py FAILED\nRoot Cause (first observed failure):\n[0]:\n  traceback : To enable traceback see: x\n"
    assert "traceback" not in dryrun.error_line("exit 3\n" + banner_only)


EXIT_ABORT_TAIL = """\
terminate called without an active exception
Fatal Python error: Aborted

Thread 0x00007f9cf8a3eb80 (most recent call first):
  <no Python frame>

Extension modules: torch._C (total: 1)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
  exitcode  : -6 (pid: 10393)  (SIGABRT)
"""


@pytest.mark.parametrize(("tail", "passed"), [
    (EXIT_ABORT_TAIL, True),
    (EXIT_ABORT_TAIL.replace("<no Python frame>", 'File "/work/run/train.py", line 9 in main'), False),
])
def test_an_abort_in_python_shutdown_after_finishing_does_not_fail_the_dry_run(
    tail: str, passed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "archive"
    root.mkdir()
    (root / "train.py").write_text("print('trains')\n")
    work = tmp_path / "work"
    work.mkdir()

    def finish_then_abort(*args: object, **kwargs: object) -> dryrun.sandbox.Finished:
        (work / "run" / "out").mkdir(parents=True)
        (work / "run" / "out" / "final.pt").write_bytes(b"checkpoint")
        (work / "run" / STEP_LOG_FILE).parent.mkdir(parents=True, exist_ok=True)
        (work / "run" / STEP_LOG_FILE).write_text(step_log([1.0, 2.0, 3.0]))
        return dryrun.sandbox.Finished(1, tail)

    monkeypatch.setattr(dryrun, "build_clean_env", lambda work, prepare: work / "venv" / "bin" / "python")
    monkeypatch.setattr(dryrun.sandbox, "run_confined", finish_then_abort)
    monkeypatch.setattr(dryrun, "load_and_list", lambda *a, **k: (True, "loads", {}))
    result = dryrun.dry_run(root, ["train.py"], work, nproc=2, lnc=2, prepare=None, steps=3, timeout=60)
    assert result.passed is passed
    what = "a rank then aborted in Python's shutdown" if passed else "train.py exited 1"
    assert what in result.reason
    assert "Fatal Python error: Aborted" in result.output or passed


def test_verify_says_which_check_is_running(tmp_path: Path) -> None:
    from trnfrontier.progress import Steps
    from trnfrontier.verify import Options, verify_archive
    from trnfrontier.verify.runner import progress_units

    seen: list[str] = []

    class Recorder(Steps):
        def describe(self, description: str) -> None:
            seen.append(description)

    not_a_tar = tmp_path / "s.tar"
    not_a_tar.write_bytes(b"not a tar")
    report = verify_archive(not_a_tar, Options(dry_run=True), progress=Recorder())
    assert report.get("extract").verdict == "fail"
    assert seen == ["checking s.tar: extraction, manifest, pins, screen, checkpoint, budget"]
    assert progress_units(Options(dry_run=True, rerun_eval=True)) == 4
