"""contract/inference.py with the inference.py trnf writes: the same log-probabilities as
load_for_eval's logits, through both of its entry points and CORE's scoring call."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trnfrontier.contract.inference import InferenceError, import_inference, load_inference
from trnfrontier.contract.inference_source import inference_py_source
from trnfrontier.runtime import checkpoint as ck
from trnfrontier.runtime.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def final_pt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=96, sequence_len=32, n_layer=2, n_head=2, n_kv_head=1, n_embd=32, value_embeds=True))
    with torch.no_grad():  # projections start at zero: give every block something to do
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    run = tmp_path_factory.mktemp("run")
    return ck.save_final(run, model, {"step": 1}) / "final.pt"


@pytest.fixture()
def inference_py(tmp_path: Path) -> Path:
    path = tmp_path / "inference.py"
    path.write_text(inference_py_source())
    return path


def test_logprobs_are_log_softmax_of_load_for_eval_logits_bit_for_bit(final_pt: Path, inference_py: Path) -> None:
    wrapped = load_inference(inference_py, final_pt, train_module=ck)
    tokens = torch.randint(0, 96, (3, 20))
    reference = torch.log_softmax(ck.load_for_eval(str(final_pt))(tokens).float(), dim=-1)
    assert torch.equal(wrapped.logprobs(tokens), reference)


def test_shared_prefix_path_matches_the_whole_rows(final_pt: Path, inference_py: Path) -> None:
    wrapped = load_inference(inference_py, final_pt, train_module=ck)
    assert wrapped.shares_prefixes
    prefix, rows = torch.randint(0, 96, (2, 9)), torch.randint(0, 96, (5, 6))
    owner = torch.tensor([0, 0, 1, 1, 1])
    after = wrapped.logprobs_after(prefix, rows, owner)
    whole = wrapped.logprobs(torch.cat((prefix[owner], rows), dim=1))[:, 9:]
    torch.testing.assert_close(after, whole, atol=1e-5, rtol=0)


def test_core_score_reads_loss_and_argmax_off_the_logprobs(final_pt: Path, inference_py: Path) -> None:
    wrapped = load_inference(inference_py, final_pt, train_module=ck)
    prefix, rows, owner = torch.zeros(1, 0, dtype=torch.long), torch.randint(0, 96, (2, 7)), torch.tensor([0, 0])
    positions = torch.tensor([[0, 0], [0, 5], [1, 3]])
    loss, argmax, margin = wrapped.core_score(prefix, rows, owner, positions)
    logits = ck.load_for_eval(str(final_pt))(rows)[positions[:, 0], positions[:, 1]]
    targets = rows[positions[:, 0], positions[:, 1] + 1]
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, targets, reduction="none"), atol=1e-5, rtol=0)
    assert torch.equal(argmax, logits.argmax(-1)) and bool((margin >= 0).all())


def test_an_inference_py_without_the_interface_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "inference.py"
    path.write_text("def load_model(checkpoint_path, device):\n    return None\n")
    with pytest.raises(InferenceError, match="does not define next_token_logprobs"):
        import_inference(path)


def test_a_wrong_shape_is_refused(final_pt: Path, tmp_path: Path) -> None:
    path = tmp_path / "inference.py"
    path.write_text(inference_py_source() + "\n\ndef next_token_logprobs(model, tokens):\n    return model(tokens)[:, -1]\n")
    wrapped = load_inference(path, final_pt, train_module=ck)
    with pytest.raises(InferenceError, match=r"expected float log-probabilities \[2, 5, vocab\]"):
        wrapped.logprobs(torch.zeros(2, 5, dtype=torch.long))
