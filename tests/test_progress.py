"""Progress off a terminal: plain lines saying what is being done, once each."""

from __future__ import annotations

import pytest

from trnfrontier.progress import Steps, steps


def test_off_a_terminal_each_new_description_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with steps("profiling x", 10) as bar:
        bar.describe("x: warm-up")
        bar.describe("x: warm-up")
        bar.advance(3)
        bar.describe("x: timing steps")
    assert capsys.readouterr().err.splitlines() == ["profiling x ...", "x: warm-up", "x: timing steps"]
    assert bar.done == 3


def test_work_that_may_be_refused_announces_nothing_first(capsys: pytest.CaptureFixture[str]) -> None:
    with steps("scoring", 1, announce=False):
        pass
    assert capsys.readouterr().err == ""
    with steps("silent", 1, enabled=False) as bar:
        bar.describe("not shown")
    assert capsys.readouterr().err == "" and isinstance(bar, Steps)


def test_a_child_process_progress_is_relayed_to_the_parent_bar(tmp_path) -> None:
    from trnfrontier.progress import FileSteps, relay

    path = tmp_path / "progress.jsonl"
    bar = Steps.none()
    poll = relay(path, bar)
    poll()  # nothing written yet
    child = FileSteps(path, scale=2)
    child.describe("task a")
    child.advance(3)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"advance": 5')  # a line still being written waits for the next poll
    poll()
    assert bar.done == 6
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("}\n")
    poll()
    assert bar.done == 11
