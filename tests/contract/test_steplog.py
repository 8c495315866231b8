"""contract/steplog.py: the one reader of the step log, with every rule its readers had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trnfrontier.contract.steplog import Segment, StepLogError, read_step_log


def _log(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "step_boundaries.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def _header(start: float) -> dict:
    return {"header": True, "start_time": start, "pid": 7}


def test_one_process_is_one_segment(tmp_path: Path) -> None:
    log = read_step_log(_log(tmp_path, _header(100.0), {"step": 0, "time": 101.5}, "", {"step": 1, "time": 102.0}))
    assert log.segments == (Segment(100.0, ((0, 101.5), (1, 102.0))),)
    assert log.last is log.segments[0]


def test_a_resumed_run_has_a_segment_per_process_and_the_last_counts(tmp_path: Path) -> None:
    log = read_step_log(_log(tmp_path, _header(1.0), {"step": 0, "time": 2.0}, _header(50.0), {"step": 1, "time": 60.0}))
    assert [s.start for s in log.segments] == [1.0, 50.0]
    assert log.last == Segment(50.0, ((1, 60.0),))


def test_a_process_that_recorded_nothing_is_an_empty_segment(tmp_path: Path) -> None:
    assert read_step_log(_log(tmp_path, _header(5.0))).last == Segment(5.0, ())


@pytest.mark.parametrize("lines,match", [
    ([], "no header line"),
    ([{"step": 0, "time": 1.0}], "line 1 comes before any header line"),
    ([{"step": 0, "time": 1.0}, _header(0.0)], "line 1 comes before any header line"),
    ([_header(0.0), {"step": 0, "time": float("nan")}], "line 2 has a non-finite time"),
    ([_header(0.0), {"step": 0, "time": float("inf")}], "line 2 has a non-finite time"),
    ([_header(float("nan")), {"step": 0, "time": 1.0}], "line 1 has a non-finite start time"),
    ([_header(0.0), "not json"], "line 2 is neither a header nor"),
    ([_header(0.0), {"step": "x", "time": 1.0}], "line 2 is neither"),
    ([_header(0.0), {"time": 1.0}], "line 2 is neither"),
    ([_header(0.0), [1, 2]], "line 2 is neither"),
    ([{"header": True}], "line 1 is neither"),
    ([_header(0.0), "[" * 100_000 + "]" * 100_000], "line 2 is neither"),  # RecursionError in json
])
def test_what_is_not_a_step_log_is_refused_naming_the_line(tmp_path: Path, lines: list, match: str) -> None:
    with pytest.raises(StepLogError, match=match):
        read_step_log(_log(tmp_path, *lines))


def test_bytes_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(json.dumps(_header(0.0)).encode() + b"\n\xff\xfe\n")
    with pytest.raises(StepLogError, match="not UTF-8"):
        read_step_log(path)


def test_a_missing_log_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        read_step_log(tmp_path / "absent.jsonl")
