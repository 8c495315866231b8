"""trnfrontier.evaluate.library and the eval worker's checks, without the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trnfrontier.errors import UsageError
from trnfrontier.evaluate import library as evaluation
from trnfrontier.evaluate.spec import WorkerSpec
from trnfrontier.evaluate.worker import batch_independence_check
from trnfrontier.runtime.model import GPT, GPTConfig

torch.set_num_threads(1)

PREPARE = SimpleNamespace(EVAL_TOKENS_PUBLIC=2_097_152, EVAL_TOKENS_OFFICIAL=20_971_520, EVAL_SEQ_LEN=1024, EVAL_TIMEOUT_SECONDS=1200)


def test_tokens_presets_and_counts() -> None:
    assert evaluation.parse_tokens("public", PREPARE) == 2_097_152
    assert evaluation.parse_tokens("official", PREPARE) == 20_971_520
    assert evaluation.parse_tokens("65_536", PREPARE) == 65536
    for bad in ("lots", "0", "-5"):
        with pytest.raises(UsageError):
            evaluation.parse_tokens(bad, PREPARE)


def _ok(path: str, value: float) -> dict:
    return {"path": path, "val_bpb": value, "causality": {"passed": True}, "batch_independence": {"passed": True}}


def test_several_results_sort_by_val_bpb_with_delta_to_best() -> None:
    results = [
        _ok("b", 1.25),
        {"path": "broken", "error": "not a checkpoint"},
        _ok("a", 1.0),
        dict(_ok("cheat", 0.5), causality={"passed": False, "max_abs_diff": 3.0}),
        _ok("c", 1.5),
    ]
    for r in results:
        r["status"], r["reasons"] = evaluation.verdict(r)
    ranked = evaluation.rank(results)
    assert [r["path"] for r in ranked] == ["a", "b", "c", "cheat", "broken"]
    assert [r["delta_to_best"] for r in ranked[:3]] == [0.0, 0.25, 0.5]
    # An invalid model's (better-looking) score never becomes the best.
    assert ranked[3]["status"] == "invalid" and ranked[3]["delta_to_best"] == -0.5
    assert "causality" in ranked[3]["reasons"][0]
    assert ranked[4]["status"] == "error" and ranked[4]["delta_to_best"] is None


def test_verdict_flags_timeout_and_nan() -> None:
    over = dict(_ok("x", 1.0), eval_over_timeout=True, timeout=5)
    assert evaluation.verdict(over)[0] == "invalid"
    assert "timeout" in evaluation.verdict(over)[1][0]
    assert evaluation.verdict(_ok("y", math.nan))[0] == "invalid"


def _tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=256, sequence_len=32, n_layer=1, n_head=2, n_kv_head=1, n_embd=32)).eval()


def test_batch_independence_passes_for_the_gpt() -> None:
    result = batch_independence_check(_tiny_gpt(), vocab_size=256, seq_len=32, device=torch.device("cpu"))
    assert result["passed"], result


class _RowMixer(torch.nn.Module):
    """Causal, but every row sees the batch mean: logits depend on the other rows."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _tiny_gpt()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        logits = self.inner(idx)
        return logits + logits.mean(dim=0, keepdim=True)


class _Stateful(torch.nn.Module):
    """Pure per batch, but each call shifts the logits: not stateless."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _tiny_gpt()
        self.calls = 0

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.inner(idx) + self.calls


@pytest.mark.parametrize("model_cls", [_RowMixer, _Stateful])
def test_batch_independence_fails_for_row_mixing_or_stateful_models(model_cls: type) -> None:
    result = batch_independence_check(model_cls(), vocab_size=256, seq_len=32, device=torch.device("cpu"))
    assert not result["passed"]
    assert result["max_abs_diff"] > result["tolerance"]


def _write(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


def test_recorded_settings_come_from_the_run_summary(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write(run / "summary.json", {"val_bpb": 1.2345, "eval_tokens": 4096, "eval_seq_len": 128})
    _write(run / "final" / "meta.json", {"recipe": {"eval": {"tokens": 1, "seq_len": 2, "batch_size": 6}}})
    _write(run / "checkpoints" / "step_000010" / "meta.json", {"recipe": {"eval": {"tokens": 1, "seq_len": 2, "batch_size": 6}}})
    (run / "checkpoints" / "step_000010" / "model.safetensors").write_bytes(b"")
    (run / "final" / "final.pt").write_bytes(b"")
    for final in (run, run / "final", run / "final" / "final.pt"):
        found = evaluation.recorded_settings(final)
        assert (found["tokens"], found["seq_len"], found["batch_size"]) == (4096, 128, 6), final
        assert found["recorded_val_bpb"] == 1.2345
    # A resumable checkpoint shares the run's settings, but the summary's score is not its score.
    step = evaluation.recorded_settings(run / "checkpoints" / "step_000010")
    assert step["seq_len"] == 128 and "recorded_val_bpb" not in step


def test_the_trainers_score_is_compared_only_at_its_own_settings(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write(run / "summary.json", {"val_bpb": 1.2345, "eval_tokens": 4096, "eval_seq_len": 128, "eval_batch_size": 6})
    _write(run / "final" / "meta.json", {})
    (run / "final" / "final.pt").write_bytes(b"")
    same = evaluation.worker_spec(evaluation.Target(run), evaluation.EvalOptions(), PREPARE)
    assert same.recorded_val_bpb == 1.2345
    other = evaluation.worker_spec(evaluation.Target(run), evaluation.EvalOptions(tokens="131072"), PREPARE)
    assert other.recorded_val_bpb is None  # another measurement: nothing to call equal or DIFFERENT


def test_defaults_without_a_record_are_the_contracts(tmp_path: Path) -> None:
    lone = tmp_path / "model.safetensors"
    lone.write_bytes(b"")
    spec = evaluation.worker_spec(evaluation.Target(lone), evaluation.EvalOptions(), PREPARE)
    assert (spec.tokens, spec.seq_len, spec.batch_size, spec.timeout) == (2_097_152, 1024, 8, 1200.0)
    chosen = evaluation.worker_spec(
        evaluation.Target(lone), evaluation.EvalOptions(tokens="official", seq_len=2048, batch_size=2, timeout=9), PREPARE
    )
    assert (chosen.tokens, chosen.seq_len, chosen.batch_size, chosen.timeout) == (20_971_520, 2048, 2, 9)
    assert chosen.tokens_source == "--tokens" and chosen.seq_len_source == "--seq-len"
    assert WorkerSpec.from_json(chosen.to_json()) == chosen  # what crosses to the worker comes back whole


def test_no_targets_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        evaluation.evaluate([], evaluation.EvalOptions())


def _spec(device: str, core: dict | None) -> WorkerSpec:
    return WorkerSpec(
        path="run", train_py=None, checkpoint=None, tokens=1, tokens_source="test", seq_len=8, seq_len_source="test",
        batch_size=1, device=device, timeout=1.0, allow_mismatch=False, sample_tokens=0, prompt="", temperature=1.0,
        threads=None, recorded_val_bpb=None, recorded_shas=None, core=core,
    )


@pytest.mark.parametrize(("device", "core", "kept"), [("cpu", {"bundle": "x"}, True), ("cpu", None, False), ("cuda", {"bundle": "x"}, False)])
def test_a_core_worker_on_the_host_keeps_freed_memory_in_the_heap(monkeypatch, device: str, core: dict | None, kept: bool) -> None:
    from trnfrontier.runtime import host_memory

    seen: dict = {}

    def run_tree(argv, timeout, env, poll):
        seen.update(env)
        return SimpleNamespace(timed_out=False, stdout='{"ok": true}\n', stderr="", returncode=0)

    for name in (*host_memory.KEEP_FREED, host_memory.HOST_MALLOC_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(evaluation.processes, "run_tree", run_tree)
    assert evaluation.run_worker(_spec(device, core)) == {"ok": True}
    assert all((seen.get(name) == value) == kept for name, value in host_memory.KEEP_FREED.items())
