"""trnf verify on Phase 2 archives: inference.py must score with the trained model.

Each archive is verify_kit's tiny submission with Phase 2's launch and an inference.py:
the one trnf writes, or one that scores with something else (another model, another
checkpoint, a cached answer), which verify must refuse with the reason.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from verify_kit import TRAIN_PY, build_archive, good_meta, pins_file

from trnfrontier import submission as fmt
from trnfrontier.contract.inference import load_inference
from trnfrontier.contract.inference_source import inference_py_source
from trnfrontier.contract.launch import launch_line
from trnfrontier.contract.phases import PHASES
from trnfrontier.verify import Options, verify_archive
from trnfrontier.verify.inference_check import (
    BATCH,
    CAUSAL,
    COMPARED_BATCHES,
    CONSISTENT,
    TV_TOLERANCE,
    Judge,
    RemoteInference,
    _time_check,
    judge_bundle,
    judge_probes,
    judge_shared_prefix,
    total_variation,
)

SERVER = launch_line(64, 2)
HONEST = inference_py_source()
# Another model: the trained one with its head re-drawn.
OTHER_MODEL = HONEST + '''

def load_model(checkpoint_path, device="cpu"):
    import train

    model = train.load_for_eval(checkpoint_path, device)
    torch.manual_seed(1)
    model.head.weight.data.normal_(0.0, 0.5)
    return model
'''
# Another checkpoint: the path it was given ignored, a freshly initialised model instead.
OTHER_CHECKPOINT = HONEST + '''

def load_model(checkpoint_path, device="cpu"):
    import train

    torch.manual_seed(7)
    return train.TinyGPT(**train.CONFIG).eval()
'''
# A cached answer: the same distribution whatever the tokens.
CACHED = HONEST + '''

_CACHE = {}


def next_token_logprobs(model, tokens):
    if "answer" not in _CACHE:
        _CACHE["answer"] = torch.log_softmax(model(tokens[:1, :1]).float(), dim=-1)[0, 0]
    return _CACHE["answer"].expand(tokens.size(0), tokens.size(1), -1).clone()
'''
# Another answer at one batch size: the batch of one, say, that a server's fast path takes.
BIASED_ALONE = HONEST + '''

_honest = next_token_logprobs


def next_token_logprobs(model, tokens):
    out = _honest(model, tokens)
    if tokens.size(0) == 1:
        out = torch.log_softmax(out + torch.linspace(0.0, 4.0, out.size(-1)), dim=-1)
    return out
'''
# Non-causal only where the next token repeats this one: random rows almost never do, so
# every whole-row comparison with load_for_eval passes; only the causality probe sees it.
PEEKS_AT_REPEATS = HONEST + '''

_honest = next_token_logprobs


def next_token_logprobs(model, tokens):
    out = _honest(model, tokens)
    repeats = torch.zeros(tokens.shape, dtype=torch.bool)
    repeats[:, :-1] = tokens[:, 1:] == tokens[:, :-1]
    peeked = torch.log_softmax(out + torch.linspace(0.0, 4.0, out.size(-1)), dim=-1)
    return torch.where(repeats.unsqueeze(-1), peeked, out)
'''
# Honest on the shared-prefix path for its first calls (as many as CORE batches are compared), then not.
HONEST_AT_FIRST = HONEST + '''

_CALLS = [0]
_honest_after = next_token_logprobs_after


def next_token_logprobs_after(model, prefix, rows, owner):
    _CALLS[0] += 1
    out = _honest_after(model, prefix, rows, owner)
    return out if _CALLS[0] <= 3 else torch.log_softmax(torch.zeros_like(out), dim=-1)
'''


def _phase2_archive(workdir: Path, inference_py: str | None, launch: str = SERVER) -> Path:
    meta = {**good_meta(launch=launch), "phase": 2}
    extra = {fmt.INFERENCE_PY: inference_py.encode()} if inference_py is not None else {}
    return build_archive(workdir, meta=meta, launch=launch, extra=extra)


def _verify(tmp_path: Path, archive: Path) -> dict:
    report = verify_archive(archive, Options(pins_file=pins_file(tmp_path), seed=11))
    return {c.name: c for c in report.checks} | {"_ok": report.ok}


def test_total_variation_is_half_the_l1_distance() -> None:
    import torch

    a = torch.log(torch.tensor([[0.5, 0.5]]))
    b = torch.log(torch.tensor([[0.9, 0.1]]))
    assert abs(total_variation(a, b) - 0.4) < 1e-6 and total_variation(a, a) == 0.0


@pytest.mark.slow
def test_the_inference_py_trnf_writes_passes(sample_home: Path, tmp_path: Path) -> None:
    checks = _verify(tmp_path, _phase2_archive(tmp_path, HONEST))
    assert checks["launch"].verdict == "pass" and checks["inference"].verdict == "pass", checks["inference"].reason
    assert f"tolerance {TV_TOLERANCE}" in checks["inference"].reason
    # The default bundle is the format sample: its time is no projection of CORE's, and verify says so.
    time = checks["core-time"]
    assert time.verdict == "skip" and not time.required and "--core-bundle PATH|URL" in time.reason, time.reason
    assert checks["_ok"], [(c.name, c.reason) for c in checks.values() if not isinstance(c, bool) and not c.ok]


@pytest.mark.slow
@pytest.mark.parametrize("source", [OTHER_MODEL, OTHER_CHECKPOINT, CACHED, HONEST_AT_FIRST],
                         ids=["another-model", "another-checkpoint", "cached-answer", "honest-at-first"])
def test_an_inference_py_that_scores_with_something_else_is_refused(sample_home: Path, tmp_path: Path, source: str) -> None:
    checks = _verify(tmp_path, _phase2_archive(tmp_path, source))
    assert checks["inference"].verdict == "fail" and not checks["_ok"]
    assert "consistent with load_for_eval off by TV" in checks["inference"].reason


class _Reference:
    """load_for_eval's side of the judgements, in this process: the model's logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.model(rows).float()


def _in_process(tmp_path: Path, source: str) -> tuple[_Reference, object, int]:
    """The reference and inference.py ``source`` over one tiny model, without sandboxes: the
    judgements see exactly what verify's servers would send them."""
    train = types.ModuleType("train")
    exec(compile(TRAIN_PY, "train.py", "exec"), train.__dict__)  # noqa: S102 - the test's own train.py
    torch.manual_seed(0)
    model = train.TinyGPT(**train.CONFIG).eval()
    train.load_for_eval = lambda path, device="cpu": model
    (tmp_path / "inference.py").write_text(source)
    return _Reference(model), load_inference(tmp_path / "inference.py", "unused", train_module=train), train.CONFIG["vocab_size"]


def _judged(tmp_path: Path, source: str, seed: int = 11) -> Judge:
    reference, inference, vocab = _in_process(tmp_path, source)
    judge = Judge()
    judge_probes(reference, inference, vocab, seed, judge)  # type: ignore[arg-type]
    judge_shared_prefix(reference, inference, vocab, seed, judge)  # type: ignore[arg-type]
    return judge


def test_the_honest_inference_py_passes_every_judgement_in_process(tmp_path: Path) -> None:
    judge = _judged(tmp_path, HONEST)
    assert not judge.failures() and set(judge.worst) == {CONSISTENT, CAUSAL, BATCH}


def test_an_answer_that_changes_at_one_batch_size_is_refused_as_batch_dependent(tmp_path: Path) -> None:
    failures = _judged(tmp_path, BIASED_ALONE).failures()
    assert any(f.startswith(f"{BATCH} off by TV") and "batches of 1" in f for f in failures), failures
    assert not any(f.startswith(CAUSAL) for f in failures), failures


def test_a_wrapper_that_peeks_only_at_repeats_is_refused_as_non_causal(tmp_path: Path) -> None:
    judge = _judged(tmp_path, PEEKS_AT_REPEATS)
    # Every whole-row comparison with load_for_eval passes: only the causality probe can see it.
    assert judge.worst[CONSISTENT][0] <= TV_TOLERANCE and judge.worst[BATCH][0] <= TV_TOLERANCE
    assert [f for f in judge.failures() if f.startswith(f"{CAUSAL} off by TV")] and "repeating" in judge.worst[CAUSAL][1]


def test_a_shared_prefix_path_honest_only_at_first_is_refused(tmp_path: Path) -> None:
    reference, inference, vocab = _in_process(tmp_path, HONEST_AT_FIRST)
    inference.info = {}  # type: ignore[attr-defined] - what a served one said when ready
    remote, judge = RemoteInference(inference, seed=11), Judge()  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(3)
    for _ in range(COMPARED_BATCHES):  # the first CORE batches: honest, and all of them kept
        rows = torch.randint(0, vocab, (2, 6), generator=gen)
        remote.core_score(rows[:, :3], rows[:, 3:], torch.arange(2), torch.tensor([[0, 1]]))
    judge_bundle(reference, remote, judge)  # type: ignore[arg-type]
    assert not judge.failures()
    judge_shared_prefix(reference, inference, vocab, 11, judge)  # type: ignore[arg-type]
    failures = judge.failures()
    assert len(failures) == 1 and "random shared-prefix probe" in failures[0] and failures[0].startswith(CONSISTENT)


class _Answers:
    """A served inference.py that answers zeros: enough to watch which calls are kept."""

    info: dict = {}

    def logprobs_after(self, prefix: torch.Tensor, rows: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
        return torch.zeros(rows.size(0), rows.size(1), 2)


def test_the_core_batches_compared_are_a_random_sample_of_all_calls() -> None:
    kept = []
    for seed in (1, 2):
        remote = RemoteInference(_Answers(), seed=seed)  # type: ignore[arg-type]
        for _ in range(40):
            remote.core_score(torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long),
                              torch.zeros(1, dtype=torch.long), torch.tensor([[0, 0]]))
        kept.append(sorted(call for call, *_ in remote.kept))
    assert all(len(set(calls)) == COMPARED_BATCHES for calls in kept)
    assert all(max(calls) > COMPARED_BATCHES for calls in kept) and kept[0] != kept[1]


def _core_report(sample: bool, seconds_at_64: float) -> dict:
    return {"format_sample": sample, "max_per_task": 4, "bundle": "b.zip",
            "projection": {"limit_seconds": 3600.0, "items_in_bundle": 112 if sample else 90_000,
                           "seconds_at_ranks": {"64": seconds_at_64}}}


def test_core_time_on_the_format_sample_is_no_projection_and_names_the_flag() -> None:
    check = _time_check(_core_report(True, 60.0), PHASES[2], 64)
    assert check.verdict == "skip" and not check.required
    assert "not a projection of the real CORE time" in check.reason and "--core-bundle PATH|URL" in check.reason


def test_core_time_on_a_real_bundle_is_judged_against_the_limit() -> None:
    within = _time_check(_core_report(False, 600.0), PHASES[2], 64)
    assert within.verdict == "pass" and "10.0 min of the 60-minute limit" in within.reason
    over = _time_check(_core_report(False, 7200.0), PHASES[2], 64)
    assert over.verdict == "skip" and not over.required and "errs long" in over.reason


def test_a_phase_2_archive_needs_inference_py_and_a_phase_2_launch(tmp_path: Path) -> None:
    checks = _verify(tmp_path, _phase2_archive(tmp_path, None, launch=launch_line(4, 2)))
    assert checks["launch"].verdict == "fail" and "--nproc_per_node=64 or 128" in checks["launch"].reason
    checks = _verify(tmp_path, _phase2_archive(tmp_path, None))
    assert checks["inference"].verdict == "fail" and "carry inference.py" in checks["inference"].reason
