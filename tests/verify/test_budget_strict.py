"""The budget from logs, strict (issue 26): step times finite and never backwards, segments
that cannot be negative, finite start times, and every statement of the archive that its
run went over budget honoured. The five archives that passed before are refused here, each
with the field named; an honest archive still passes; a log without a header line is read
from the launch time its kit run recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from verify_kit import GOOD_TIMES, build_archive, step_log, tiny_state, write_files

from trnfrontier import submission as fmt
from trnfrontier.contract.phases import DEFAULT_PHASE, PHASES
from trnfrontier.verify import Options, verify_archive
from trnfrontier.verify.report import Check
from trnfrontier.verify.runner import _budget_check

PHASE_1 = PHASES[DEFAULT_PHASE]


def _check(root: Path) -> Check:
    """verify's budget check of an extracted archive at ``root`` (Phase 1, the documented formula)."""
    return _budget_check(root, None, PHASE_1)


RESUMED = b'{"val_bpb": 12.0, "resumed_from": "runs/x/checkpoints/step_000005"}'


def _line(record: dict) -> str:
    return json.dumps(record) + "\n"


def _backwards() -> str:
    """A step log whose times go backwards: step 59 ends 500 s before step 58."""
    lines = step_log(GOOD_TIMES).splitlines(keepends=True)
    last = json.loads(lines[-1])
    lines[-1] = _line({"step": last["step"], "time": last["time"] - 500.0})
    return "".join(lines)


CASES = {
    "times go backwards": ({fmt.STEP_LOG: _backwards().encode()}, "step 59 ends at", "time goes backwards"),
    "NaN start time": ({fmt.STEP_LOG: (_line({"header": True, "start_time": float("nan")}) + step_log(GOOD_TIMES).split("\n", 1)[1]).encode()},
                       "line 1 has a non-finite start time", ""),
    # A second process that "started" before the first one's last step: a negative gap, which
    # would take time off the resumed run's total.
    "negative segment": ({fmt.STEP_LOG: (step_log([20.0, 30.0, 40.0, 50.0, 60.0, 1000.0], start=10_000.0)
                                         + step_log([10.0, 20.0], start=2_000.0)).encode(), fmt.SUMMARY: RESUMED},
                         "a process starts at 2000.000, before the previous one's last step ended", ""),
    "NaN segment": ({fmt.STEP_LOG: (step_log(GOOD_TIMES[:10]) + _line({"header": True, "start_time": 20_000.0})
                                    + _line({"step": 10, "time": float("nan")})).encode(), fmt.SUMMARY: RESUMED},
                    "line 13 has a non-finite time", ""),
    "checkpoint meta says over budget": ({fmt.CHECKPOINT_META: json.dumps({"model_config": {"vocab_size": 8192}, "charged_seconds": 2400.0}).encode()},
                                         "checkpoint/meta.json: charged_seconds is 2400 s, over the 1800 s budget", ""),
}


def _layout(tmp_path: Path, replace: dict[str, bytes], final_pt: object = None) -> Path:
    root = tmp_path / "archive"
    write_files(root, final_pt=final_pt)
    for name, data in replace.items():
        fmt.member_path(root, name).write_bytes(data)
    return root


@pytest.mark.parametrize("case", list(CASES))
def test_the_five_accepted_cases_are_refused_naming_the_field(case: str, tmp_path: Path) -> None:
    replace, first, second = CASES[case]
    check = _check(_layout(tmp_path, replace))
    assert check.verdict == "fail" and first in check.reason and second in check.reason, check.reason


def test_final_pt_meta_saying_over_budget_is_honoured(tmp_path: Path) -> None:
    """The kit's own final.pt meta records budget_elapsed_before_save: over the budget is over."""
    final_pt = {"model_state": tiny_state(), "model_config": {"vocab_size": 8192}, "meta": {"step": 60, "budget_elapsed_before_save": 1900.5}}
    check = _check(_layout(tmp_path, {}, final_pt=final_pt))
    assert check.verdict == "fail"
    assert "checkpoint/final.pt meta: budget_elapsed_before_save is 1900.5 s, over the 1800 s budget" in check.reason


def test_an_honest_archive_passes_and_a_headerless_log_reads_from_the_recorded_launch(tmp_path: Path) -> None:
    assert _check(_layout(tmp_path / "a", {})).verdict == "pass"
    launch = 1000.0
    plain = "".join(_line({"step": i, "time": launch + t}) for i, t in enumerate(GOOD_TIMES))
    recorded = {"val_bpb": 12.0, "step_log_start": {"time": launch, "source": "trnf's launch of the run (the log has no header line)"}}
    check = _check(_layout(tmp_path / "b", {fmt.STEP_LOG: plain.encode(), fmt.SUMMARY: json.dumps(recorded).encode()}))
    assert check.verdict == "pass", check.reason
    assert "start time from trnf's launch of the run (the log has no header line) (as summary.json records it)" in check.reason
    check = _check(_layout(tmp_path / "c", {fmt.STEP_LOG: plain.encode()}))
    assert check.verdict == "fail" and "comes before any header line, and nothing else says when" in check.reason


def test_a_log_of_durations_only_cannot_prove_the_budget(tmp_path: Path) -> None:
    dts = "".join(f"step {i:05d} | loss 9.0 | dt 1.00s\n" for i in range(60))
    recorded = {"val_bpb": 12.0, "step_log_start": {"time": 1000.0, "source": "trnf's launch"}}
    check = _check(_layout(tmp_path, {fmt.STEP_LOG: dts.encode(), fmt.SUMMARY: json.dumps(recorded).encode()}))
    assert check.verdict == "fail" and "gives each step's duration only" in check.reason


def test_a_real_archive_whose_checkpoint_says_it_ran_over_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    archive = build_archive(tmp_path, final_pt={"model_state": tiny_state(), "model_config": {"vocab_size": 8192},
                                                "meta": {"over_budget": True}})
    report = verify_archive(archive, Options(allow_unsandboxed=True))
    (budget,) = [c for c in report.checks if c.name == "budget"]
    assert not report.ok and budget.verdict == "fail"
    assert "the archive says the run went over budget: checkpoint/final.pt meta: over_budget is true" in budget.reason


def _checkpoint(root: Path) -> Check:
    """verify's checkpoint check of an extracted archive, with the manifest's parameter count right."""
    from trnfrontier.contract.checkpoint import scan_safetensors
    from trnfrontier.verify.runner import _checkpoint_check

    params = scan_safetensors(fmt.member_path(root, fmt.CHECKPOINT_SAFETENSORS)).params
    return _checkpoint_check(root, {"params": params})


_OVER = json.dumps({"charged_seconds": 2400.0})
META_CASES = {
    # A statement that the run went over, after 2 MiB of spaces: never read, so never honoured, before.
    "oversized": ((" " * (2 << 20) + _OVER).encode(), "over the 1,048,576-byte limit"),
    "not UTF-8": (b"\xff\xfe" + _OVER.encode(), "is not UTF-8 text"),
    "not JSON": (_OVER.encode()[:-1], "is not valid JSON"),
}


@pytest.mark.parametrize("case", list(META_CASES))
def test_an_unreadable_checkpoint_meta_json_is_refused_by_the_checkpoint_check(case: str, tmp_path: Path) -> None:
    data, says = META_CASES[case]
    root = _layout(tmp_path, {fmt.CHECKPOINT_META: data})
    check = _checkpoint(root)
    assert check.verdict == "fail" and fmt.CHECKPOINT_META in check.reason and says in check.reason, check.reason
    assert "budget" in check.reason


def test_a_checkpoint_meta_json_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    root = _layout(tmp_path, {})
    meta = fmt.member_path(root, fmt.CHECKPOINT_META)
    (tmp_path / "elsewhere.json").write_text(_OVER)
    meta.unlink()
    meta.symlink_to(tmp_path / "elsewhere.json")
    check = _checkpoint(root)
    assert check.verdict == "fail" and "checkpoint/meta.json is a symbolic link" in check.reason, check.reason


def test_an_honest_checkpoint_meta_json_passes_the_checkpoint_check(tmp_path: Path) -> None:
    check = _checkpoint(_layout(tmp_path, {}))
    assert check.verdict == "pass", check.reason
