"""trnfrontier.runtime.prepare_calls: how trnf calls any prepare.py (contract names only)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

from trnfrontier.runtime import prepare_calls

# A prepare.py with the kit's signatures and nothing else trnf might want (no EVAL_SEQ_LEN,
# no resume_state, no timeout_seconds on evaluate_bpb).
KIT_LIKE = '''
calls = []

def causality_check(model, tokenizer, batch_size, seq_len, device):
    calls.append(("causality_check", batch_size, seq_len, device))
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    model(__import__("torch").zeros(batch_size, seq_len, dtype=__import__("torch").long))
    return {"passed": True, "max_abs_diff": 0.0}

def evaluate_bpb(model, tokenizer, batch_size, seq_len, device, split="public_val", max_tokens=1024):
    calls.append(("evaluate_bpb", batch_size, seq_len, device, split, max_tokens))
    return {"val_bpb": 1.5, "num_tokens": max_tokens}

def make_dataloader(tokenizer, batch_size, seq_len, split, device):
    calls.append(("make_dataloader", batch_size, seq_len, split, device))
    yield None

def record_step_boundary(step):
    calls.append(("record_step_boundary", step))
'''


def _module(tmp_path: Path, source: str, name: str) -> ModuleType:
    path = tmp_path / name / "prepare.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(f"fake_prepare_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Model(torch.nn.Module):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("the model's own bug")
        return torch.zeros(*x.shape, 4)


def test_calls_are_positional_and_pass_only_accepted_keywords(tmp_path: Path) -> None:
    kit = _module(tmp_path, KIT_LIKE, "kit")
    assert prepare_calls.causality_check(kit, Model(), None, 2, 16, "cpu") == {"passed": True, "max_abs_diff": 0.0}
    result = prepare_calls.evaluate_bpb(kit, Model(), None, 3, 16, "cpu", split="public_val", max_tokens=64, timeout_seconds=9.0)
    assert result["val_bpb"] == 1.5 and result["num_tokens"] == 64
    assert result["dropped_keywords"] == ["timeout_seconds"]  # not in this signature: reported, not passed
    next(prepare_calls.make_dataloader(kit, None, 4, 16, "train", "cpu", resume_state={"epoch": 1}, rank=0, world_size=1))
    prepare_calls.record_step_boundary(kit, 0)
    assert kit.calls == [
        ("causality_check", 2, 16, "cpu"),
        ("evaluate_bpb", 3, 16, "cpu", "public_val", 64),
        ("make_dataloader", 4, 16, "train", "cpu"),
        ("record_step_boundary", 0),
    ]


def test_missing_extras_fall_back_to_the_contract_defaults(tmp_path: Path) -> None:
    kit = _module(tmp_path, KIT_LIKE, "kit")
    assert prepare_calls.constant(kit, "EVAL_SEQ_LEN") == 1024
    assert prepare_calls.constant(kit, "EVAL_TOKENS_PUBLIC") == 2_097_152
    assert prepare_calls.constant(kit, "EVAL_TIMEOUT_SECONDS") == 1200


def test_an_error_raised_by_prepare_py_is_its_rejection(tmp_path: Path) -> None:
    kit = _module(tmp_path, KIT_LIKE, "kit")
    with pytest.raises(prepare_calls.PrepareRejected) as caught:
        prepare_calls.causality_check(kit, Model(), None, 0, 16, "cpu")
    message = str(caught.value)
    assert message.startswith(f"prepare.py ({kit.__file__}) rejected the call causality_check(")
    assert "batch_size must be positive" in message


def test_an_error_in_the_model_is_not_prepare_py_s(tmp_path: Path) -> None:
    kit = _module(tmp_path, KIT_LIKE, "kit")
    with pytest.raises(RuntimeError, match="the model's own bug") as caught:
        prepare_calls.causality_check(kit, Model(fail=True), None, 2, 16, "cpu")
    assert not isinstance(caught.value, prepare_calls.PrepareRejected)


def test_a_signature_that_refuses_the_kit_call_is_named(tmp_path: Path) -> None:
    old = _module(tmp_path, "def causality_check(model, vocab_size=8192):\n    return {}\n", "old")
    with pytest.raises(prepare_calls.PrepareRejected, match=r"rejected the call causality_check\(Model.*its signature"):
        prepare_calls.causality_check(old, Model(), None, 2, 16, "cpu")


def test_a_missing_contract_function_is_named(tmp_path: Path) -> None:
    empty = _module(tmp_path, "X = 1\n", "empty")
    with pytest.raises(prepare_calls.MissingName, match="defines no evaluate_bpb"):
        prepare_calls.evaluate_bpb(empty, Model(), None, 1, 8, "cpu")
    assert prepare_calls.missing_names(empty, ("evaluate_bpb", "X")) == ["evaluate_bpb"]


def test_loads_by_path_without_trnfrontier(tmp_path: Path) -> None:
    """A sandboxed probe loads the adapter from its file: it imports nothing of trnf."""
    source = Path(prepare_calls.__file__).read_text()
    assert "import trnfrontier" not in source and "from trnfrontier" not in source
    loaded = prepare_calls.load_by_path(prepare_calls.__file__)
    assert loaded.CONTRACT_NAMES == prepare_calls.CONTRACT_NAMES
