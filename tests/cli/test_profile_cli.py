"""`trnf profile`: the report, the trace, --compare, and one-line errors."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from tests.cli_run import run_cli

torch.set_num_threads(1)

TINY = """\
name: {name}
model: {{depth: {depth}, n_embd: 64, head_dim: 16, n_kv_head: 2, vocab_size: 8192, sequence_len: 64}}
data: {{batch_size: 4}}
runtime: {{device: cpu, dtype: float32, threads: 1}}
budget: {{seconds: 120, checkpoint_reserve_seconds: 5}}
"""


def recipe(tmp_path: Path, name: str = "tiny", depth: int = 1) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(TINY.format(name=name, depth=depth))
    return str(path)


def test_json_report_and_trace(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "out" / "trace.json"
    code, out, err = run_cli(["profile", recipe(tmp_path), "--steps", "2", "--warmup", "1", "--json", "--trace", str(trace)], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["data_source"].startswith("prepare.make_dataloader")
    assert set(result["phases"]) == {"data", "forward", "backward", "optimizer", "communication", "idle"}
    assert result["tokens_per_second"] > 0 and result["tokens_per_step"] == 4 * 64
    assert result["top_operators"] and all(op["name"] for op in result["top_operators"])
    assert result["peak_memory"]["bytes"] > 0
    assert result["neuron_profiler"].startswith("not applicable")
    events = json.loads(trace.read_text())
    assert events["traceEvents"]


def test_human_report_states_formula_peak_and_projection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["profile", recipe(tmp_path), "--steps", "2", "--warmup", "0", "budget.seconds=60"], capsys)
    assert code == 0
    for expected in ("step time split", "MFU", "6 x (params - embedding params)", "matmul probe", "projection", "tokens/parameter", "aten::"):
        assert expected in out, expected
    assert "55 s of budget" in out  # the override reached the recipe: 60 - 5 s reserve


def test_compare_reports_the_ratio_with_its_spread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = recipe(tmp_path, "small", 1), recipe(tmp_path, "bigger", 2)
    code, out, err = run_cli(["profile", "--compare", a, b, "--steps", "4", "--warmup", "1", "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert (result["a"]["recipe"], result["b"]["recipe"]) == ("small", "bigger")
    lo, hi = result["ratio_spread"]
    assert lo <= result["ratio_tokens_per_second_b_over_a"] <= hi
    assert len(result["ratios"]) == result["rounds"] == 4
    assert result["b"]["flops_per_token"] > result["a"]["flops_per_token"]
    verdict = result["verdict"]
    assert verdict["low"] <= verdict["ratio"] <= verdict["high"] and verdict["confidence"] == 0.95
    assert 0 < result["a"]["mfu"] and "matmul probe" in result["peak_source"]


def test_a_recipe_that_does_not_fit_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["profile", recipe(tmp_path), "model.depth=128", "model.n_embd=16384", "model.head_dim=128"], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "does not fit" in err and "data.batch_size" in err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["no_such_recipe"], "not found"),
        (["{tiny}", "model.nope=1"], "no field 'nope'"),
        (["{tiny}", "other.yaml"], "--compare"),
        (["--compare", "{tiny}"], "exactly two recipes"),
        ([], "RECIPE"),
        (["{tiny}", "--device", "banana"], "--device banana: unknown device; choose auto, cpu, cuda, neuron"),
        (["--kernels", "--device", "banana"], "--device banana: unknown device"),
        (["{tiny}", "--trace", "{dir}"], "is a directory; give the trace's file name"),
        (["{tiny}", "--trace", "{file}/trace.json"], "cannot create its folder"),
    ],
)
def test_bad_input_is_a_usage_error(args: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = recipe(tmp_path)
    folder = tmp_path / "folder"
    folder.mkdir()
    code, _, err = run_cli(["profile", *(a.format(tiny=tiny, dir=folder, file=tiny) for a in args)], capsys)
    assert code == 2 and expected in err and "Traceback" not in err
    assert err.count("\n") == 1 and "profiling" not in err  # refused before any model was built
    assert folder.is_dir() and list(folder.iterdir()) == []  # a --trace folder is left as it was


def test_kernels_table_is_wired_to_the_kernel_benchmark(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("trnfrontier.runtime.kernels") is None or importlib.util.find_spec("trnfrontier.runtime.kernels.bench") is None:
        code, _, err = run_cli(["profile", "--kernels"], capsys)
        assert code == 1 and "not available yet" in err
        return
    row = {"name": "relu2", "shape": [512, 2560], "dtype": "float32", "device": "cpu", "impl": "reference",
           "kernel_ms": 2.0, "reference_ms": 3.0, "speedup": 1.5, "achieved_gbps": 4.0, "peak_fraction": None}
    fake = types.ModuleType("trnfrontier.runtime.kernels.bench")
    fake.benchmark_kernels = lambda device: [row]
    monkeypatch.setitem(sys.modules, "trnfrontier.runtime.kernels.bench", fake)
    code, out, _ = run_cli(["profile", "--kernels", "--device", "cpu", "--json"], capsys)
    assert code == 0 and json.loads(out)["kernels"] == [row]
    code, out, _ = run_cli(["profile", "--kernels", "--device", "cpu"], capsys)
    assert code == 0 and "relu2" in out and "512x2560" in out and "x1.50" in out and "4.00 GB/s" in out
