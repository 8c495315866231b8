"""profile --compare: a verdict with its confidence; the projection and the profiler's noise."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from rich.console import Console

from trnfrontier.cli import profile_view as report
from trnfrontier.profiling import compare


def test_a_wide_spread_is_no_significant_difference() -> None:
    # The case: B/A 1.306 with rounds from 0.98 to 2.01.
    v = compare.verdict([0.98, 2.01, 1.31, 1.12, 1.25])
    assert v["low"] < 1.0 < v["high"] and not v["significant"]
    assert v["text"].startswith("no significant difference: B/A tokens/s = ")
    assert "95% interval" in v["text"]


def test_a_consistent_difference_is_named_with_its_interval() -> None:
    faster = compare.verdict([1.30, 1.31, 1.29, 1.30, 1.32])
    assert faster["significant"] and faster["low"] > 1.0 and faster["text"].startswith("B is faster")
    assert faster["ratio"] == pytest.approx(1.304, abs=1e-3)
    slower = compare.verdict([0.80, 0.81, 0.79, 0.80, 0.82])
    assert slower["significant"] and slower["high"] < 1.0 and slower["text"].startswith("B is slower")
    one = compare.verdict([1.5])
    assert one["low"] is None and not one["significant"] and "no verdict" in one["text"]


def test_token_counts_never_print_as_zero_millions() -> None:
    assert report.token_count(31_395.4) == "31,395"
    assert report.token_count(12_345_678) == "12.3M"
    assert report.token_count(2.5e9) == "2.50B"


def test_compare_report_prints_the_verdict_and_mfu() -> None:
    side = {"recipe": "cpu_smoke", "params": 10, "tokens_per_step": 4096, "step_seconds": 1.0,
            "tokens_per_second": 4096.0, "flops_per_token": 100, "mfu": 0.123, "device": "cpu"}
    result = {"rounds": 5, "steps_per_round": 2, "warmup_steps": 1, "a": side, "b": side,
              "ratio_tokens_per_second_b_over_a": 1.306, "ratio_spread": [0.98, 2.01],
              "ratios": [0.98, 2.01, 1.31, 1.12, 1.25], "verdict": compare.verdict([0.98, 2.01, 1.31, 1.12, 1.25]),
              "peak_source": "CPU: measured float32 matmul probe"}
    console = Console(record=True, width=200)
    report.render_compare(result, console)
    text = console.export_text()
    assert "no significant difference" in text and "12.3%" in text and "MFU peak: CPU: measured" in text


def test_profiler_notices_are_not_printed_but_real_warnings_are() -> None:
    script = textwrap.dedent(
        """
        import os, torch
        from torch.profiler import profile
        from trnfrontier.profiling.quiet import without_profiler_noise
        with without_profiler_noise(), profile() as prof:
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
            os.write(2, b"a real warning\\n")
        print("done")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "USDT" not in result.stderr and "a real warning" in result.stderr
