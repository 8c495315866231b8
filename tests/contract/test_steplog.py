"""contract/steplog.py: the one reader of the step log, with every rule its readers had."""

from __future__ import annotations

import json
import time
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
    ([_header(0.0), {"step": "x", "time": 1.0}], "line 2 has step 'x', not a step index"),
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


# ---------------------------------------------------------------------------- any log trnf can read


def test_a_log_without_a_header_starts_at_the_launch_and_says_so(tmp_path: Path) -> None:
    """The outside's kit: record_step_boundary writes plain {"step", "time"} lines."""
    path = _log(tmp_path, {"step": 0, "time": 110.0}, {"step": 1, "time": 112.5})
    log = read_step_log(path, launch=100.0, launch_source="trnf's launch")
    assert log.segments == (Segment(100.0, ((0, 110.0), (1, 112.5))),)
    assert log.start_source == "trnf's launch" and not log.lower_bound
    assert log.describe() == "JSON lines (step, time); start time from trnf's launch"
    with pytest.raises(StepLogError, match="line 1 comes before any header line, and nothing else says when"):
        read_step_log(path)  # nothing says when it started


@pytest.mark.parametrize("line,end", [
    ({"step": 3, "timestamp": 130.0, "loss": 2.5}, 130.0),
    ({"step": 3, "wall_time": 130.0}, 130.0),
    ({"step": 3, "elapsed": 30.0}, 130.0),
    ({"step": 3, "elapsed_seconds": 30}, 130.0),
    ({"step": 3, "dt": 0.5}, 100.5),
    ("step 00003 | loss 13.1355 | lr 0.02 | dt 0.93s | tok/s 283,017 | mfu 30.1%", 100.93),
    ("step 3/100 | loss: 3.21 | dt: 930ms", 100.93),
    ("[default0]:step 3 elapsed=30.5", 130.5),
    ("step:3 train_loss:3.2100 time=130.25", 130.25),
])
def test_other_shapes_of_a_step_record(tmp_path: Path, line: object, end: float) -> None:
    log = read_step_log(_log(tmp_path, line), launch=100.0)
    assert log.last.boundaries == ((3, pytest.approx(end)),)
    assert log.text == isinstance(line, str)


def test_ends_summed_from_dt_are_a_lower_bound_and_say_so(tmp_path: Path) -> None:
    lines = [f"step {i:05d} | loss 9.0 | dt 2.00s" for i in range(3)]
    log = read_step_log(_log(tmp_path, *lines), launch=100.0, launch_source="trnf's launch")
    assert log.last.boundaries == ((0, 102.0), (1, 104.0), (2, 106.0))
    assert log.lower_bound and "a lower bound" in log.describe() and log.describe().startswith("printed step lines (step, dt)")


# ---------------------------------------------------------------------------- strict (issue 26.6)


@pytest.mark.parametrize("lines,match", [
    # times that go backwards, within a process or against its start
    ([_header(0.0), {"step": 0, "time": 10.0}, {"step": 1, "time": 9.0}], "line 3: step 1 ends at 9.000, before step 0's end"),
    ([_header(50.0), {"step": 0, "time": 10.0}], "line 2: step 0 ends at 10.000, before its process's start"),
    # a resumed run's segment that starts before the previous one ended (a negative gap)
    ([_header(0.0), {"step": 0, "time": 10.0}, _header(5.0), {"step": 1, "time": 20.0}], "line 3: a process starts at 5.000, before"),
    ([_header(0.0), {"step": 0, "time": 1.0}, {"step": 0, "time": 2.0}], "line 3: step index 0 after 0"),
    ([_header(0.0), {"step": -1, "time": 1.0}], "line 2 has step -1"),
    ([_header(0.0), {"step": True, "time": 1.0}], "line 2 has step True"),
    ([_header(0.0), {"step": 0, "time": "12"}], "line 2 has time '12', not a number"),
    ([_header(0.0), {"step": 0, "time": 10**400}], "line 2 has time 1000"),  # no OverflowError
    ([_header(10**400), {"step": 0, "time": 1.0}], "line 1 has start time 1000"),
    ([_header(0.0), {"step": 0, "dt": -3.0}], "line 2 has a negative dt"),
    ([_header(0.0), {"step": 0, "time": -3.0}], "line 2 has a negative time"),
    ([_header(0.0), {"step": 0, "loss": 3.0}], "line 2 records step 0 but not when it ended"),
    ([_header(0.0), "step 4 | loss 3.0"], "line 2 records step 4 but not when it ended"),
    ([_header(0.0), "--- done ---"], "line 2 is neither a header nor a step record"),
])
def test_a_log_that_cannot_be_true_is_refused_naming_the_line(tmp_path: Path, lines: list, match: str) -> None:
    with pytest.raises(StepLogError, match=match.replace("(", r"\(").replace(")", r"\)")):
        read_step_log(_log(tmp_path, *lines))


# ---------------------------------------------------------------------------- what the outside found (issue 25.1)

NANOCHAT = "step {:05d}/01000 ({:.2f}%) | loss: 3.2 | lrm: 1.00 | dt: 930.12ms | tok/sec: 12,345 | mfu: 10.1 | total time: {}"


def test_nanochat_progress_lines_read_total_time_as_elapsed_in_its_unit(tmp_path: Path) -> None:
    """The "time: 0" inside "total time: 0.16m" is no absolute time; the m is minutes."""
    lines = [NANOCHAT.format(10, 1.0, "0.16m"), NANOCHAT.format(11, 1.1, "0.18m"), NANOCHAT.format(12, 1.2, "0.02h")]
    log = read_step_log(_log(tmp_path, *lines), launch=100.0, launch_source="trnf's launch")
    assert log.last.boundaries == ((10, pytest.approx(109.6)), (11, pytest.approx(110.8)), (12, pytest.approx(172.0)))
    assert log.when == ("elapsed",) and log.text and not log.lower_bound
    assert log.describe() == "printed step lines (step, elapsed seconds); start time from trnf's launch"


@pytest.mark.parametrize("line,end", [
    ("step 3 | dt: 930.12ms", 100.93012),
    ("step 3 | dt 0.5 s", 100.5),
    ("step 3 | elapsed: 2min", 220.0),
    ("step 3 | elapsed time: 1.5h", 5500.0),
    ("step 3 | loss nan | time 130", 130.0),
    ({"step": 3, "dt_ms": 250}, 100.25),
    ({"step": 3, "total time": 12.5}, 112.5),
])
def test_units_and_spelled_names_are_honoured(tmp_path: Path, line: object, end: float) -> None:
    assert read_step_log(_log(tmp_path, line), launch=100.0).last.boundaries == ((3, pytest.approx(end)),)


def test_json_behind_torchruns_tee_prefix_is_json(tmp_path: Path) -> None:
    lines = ['[default0]:{"header": true, "start_time": 100.0}', '[default0]:{"step": 0, "time": 101.0}',
             '[default0]: {"step": 1, "time": 102.5, "loss": 3.0}']
    log = read_step_log(_log(tmp_path, *lines))
    assert log.segments == (Segment(100.0, ((0, 101.0), (1, 102.5))),)
    assert not log.text and log.prefixed and "JSON lines (step, time) behind torchrun's" in log.describe()


LAUNCH = 1.7e9  # an epoch time: a run launched in 2023


def test_times_far_below_the_launch_are_seconds_since_the_start_and_say_so(tmp_path: Path) -> None:
    """A kit writing {"step": i, "time": time.perf_counter() - t0} and no header."""
    path = _log(tmp_path, *({"step": i, "time": 4.0 + 0.5 * i} for i in range(3)))
    log = read_step_log(path, launch=LAUNCH, launch_source="trnf's launch")
    assert log.last.boundaries == ((0, LAUNCH + 4.0), (1, LAUNCH + 4.5), (2, LAUNCH + 5.0))
    assert log.relative and not log.lower_bound
    assert log.describe().endswith("start time from trnf's launch; its times, far below the launch's epoch, "
                                   "read as seconds since the process started")
    # the same values after a header are the header's word: absolute, and before its start
    with pytest.raises(StepLogError, match="before its process's start"):
        read_step_log(_log(tmp_path, _header(LAUNCH), {"step": 0, "time": 4.0}))


def test_epoch_times_without_a_header_stay_absolute(tmp_path: Path) -> None:
    log = read_step_log(_log(tmp_path, {"step": 0, "time": LAUNCH + 3.0}), launch=LAUNCH)
    assert log.last.boundaries == ((0, LAUNCH + 3.0),) and not log.relative


def test_a_clock_since_boot_is_neither_and_is_refused(tmp_path: Path) -> None:
    """perf_counter() without "- t0": read since the start it would end days after the log was written."""
    path = _log(tmp_path, {"step": 0, "time": 500_000.0}, {"step": 1, "time": 500_001.0})
    with pytest.raises(StepLogError, match="neither seconds since the epoch nor since the process started"):
        read_step_log(path, launch=time.time() - 10.0)
