"""trnf verify on Phase 2 archives: inference.py must score with the trained model.

Each archive is verify_kit's tiny submission with Phase 2's launch and an inference.py:
the one trnf writes, or one that scores with something else (another model, another
checkpoint, a cached answer), which verify must refuse with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verify_kit import build_archive, good_meta, pins_file

from trnfrontier import submission as fmt
from trnfrontier.contract.inference_source import inference_py_source
from trnfrontier.contract.launch import launch_line
from trnfrontier.contract.phases import PHASES
from trnfrontier.verify import Options, verify_archive
from trnfrontier.verify.inference_check import TV_TOLERANCE, _time_check, total_variation

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
@pytest.mark.parametrize("source", [OTHER_MODEL, OTHER_CHECKPOINT, CACHED], ids=["another-model", "another-checkpoint", "cached-answer"])
def test_an_inference_py_that_scores_with_something_else_is_refused(sample_home: Path, tmp_path: Path, source: str) -> None:
    checks = _verify(tmp_path, _phase2_archive(tmp_path, source))
    assert checks["inference"].verdict == "fail" and not checks["_ok"]
    assert "consistent with load_for_eval off by TV" in checks["inference"].reason


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
