"""evaluate_bpb, token_bytes and causality_check against independent references."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

SEQ_LEN = 64
MAX_TOKENS = 4096


@pytest.fixture(scope="module")
def tokenizer(sample_home, prepare_module):
    torch.set_num_threads(1)
    return prepare_module.ensure_tokenizer()


def reference_windows(sample_home: Path, seq_len: int, max_tokens: int) -> np.ndarray:
    """The validation rows as the contract defines them, read straight from the files."""
    directory = sample_home / "datasets" / "sample"
    manifest = json.loads((directory / "manifest.json").read_text())
    stream = np.concatenate([np.fromfile(directory / e["path"], dtype=np.uint16)
                             for e in manifest["token_files"] if e["role"] == "public_val"]).astype(np.int64)
    rows = min(max_tokens // seq_len, (len(stream) - 1) // seq_len)
    return np.stack([stream[r * seq_len:r * seq_len + seq_len + 1] for r in range(rows)])


def reference_token_bytes(tokenizer) -> np.ndarray:
    size = tokenizer.get_vocab_size()
    specials = {tokenizer.encode_special(name) for name in tokenizer.get_special_tokens()}
    return np.array([0 if i in specials else len(tokenizer.decode_single_token_bytes(i)) for i in range(size)])


def test_token_bytes_is_the_length_of_every_token(tokenizer, prepare_module) -> None:
    got = prepare_module.get_token_bytes().numpy()
    assert got.dtype == np.int32 and got.shape == (tokenizer.get_vocab_size(),)
    assert np.array_equal(got, reference_token_bytes(tokenizer))
    specials = sorted(tokenizer.encode_special(name) for name in tokenizer.get_special_tokens())
    assert specials == list(range(tokenizer.get_vocab_size() - 4, tokenizer.get_vocab_size()))
    assert tokenizer.get_bos_token_id() == specials[0]
    assert all(got[i] == 0 for i in specials) and (got[: specials[0]] > 0).all()


def test_zero_logits_give_log2_vocab_per_counted_byte(tokenizer, sample_home, prepare_module, tiny_models) -> None:
    vocab = tokenizer.get_vocab_size()
    result = prepare_module.evaluate_bpb(tiny_models.ZeroLogits(vocab), tokenizer, 4, seq_len=SEQ_LEN, max_tokens=MAX_TOKENS)
    targets = reference_windows(sample_home, SEQ_LEN, MAX_TOKENS)[:, 1:]
    weights = reference_token_bytes(tokenizer)[targets]
    counted, total_bytes = int((weights > 0).sum()), int(weights.sum())
    # The kit's meaning: num_tokens is every target scored (the requested count), while
    # num_bytes (and the nats) leave out the 0-byte specials.
    assert result["num_tokens"] == targets.size == MAX_TOKENS and result["num_bytes"] == total_bytes
    assert result["val_bpb"] == pytest.approx(math.log2(vocab) * counted / total_bytes, rel=1e-6)
    assert result["eval_over_timeout"] is False


def test_special_targets_carry_no_bytes_and_are_excluded(tokenizer, sample_home, prepare_module, tiny_models) -> None:
    vocab, bos = tokenizer.get_vocab_size(), tokenizer.get_bos_token_id()
    targets = reference_windows(sample_home, SEQ_LEN, MAX_TOKENS)[:, 1:]
    assert (targets == bos).sum() > 0, "the validation rows should contain document starts"
    # Predicting BOS as impossible would cost ~1e4 nats per BOS target if they were counted.
    model = tiny_models.ZeroLogits(vocab, bias={bos: -1e4})
    result = prepare_module.evaluate_bpb(model, tokenizer, 4, seq_len=SEQ_LEN, max_tokens=MAX_TOKENS)
    assert result["num_tokens"] == targets.size  # every target position counts, specials included
    weights = reference_token_bytes(tokenizer)[targets]
    assert result["val_bpb"] == pytest.approx(math.log2(vocab - 1) * (weights > 0).sum() / weights.sum(), rel=1e-6)


def test_random_logits_match_a_float64_reference(tokenizer, sample_home, prepare_module, tiny_models) -> None:
    model = tiny_models.RandomLogits(tokenizer.get_vocab_size(), seed=3)
    result = prepare_module.evaluate_bpb(model, tokenizer, 4, seq_len=SEQ_LEN, max_tokens=MAX_TOKENS)
    rows = reference_windows(sample_home, SEQ_LEN, MAX_TOKENS)
    x, y = rows[:, :-1], rows[:, 1:]
    a, b, c = (p.detach().double().numpy() for p in (model.a, model.b, model.c))
    logits = a[x][..., None] * b + c  # float64 throughout
    peak = logits.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(logits - peak).sum(axis=-1)) + peak[..., 0]
    nats = log_z - np.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
    weights = reference_token_bytes(tokenizer)[y]
    expected = (nats * (weights > 0)).sum() / (math.log(2) * weights.sum())
    assert result["val_bpb"] == pytest.approx(expected, rel=1e-6)
    assert result["total_nats"] == pytest.approx((nats * (weights > 0)).sum(), rel=1e-6)


def test_batch_size_does_not_change_the_result(tokenizer, prepare_module, tiny_models) -> None:
    model = tiny_models.RandomLogits(tokenizer.get_vocab_size(), seed=5)
    results = [prepare_module.evaluate_bpb(model, tokenizer, b, seq_len=SEQ_LEN, max_tokens=MAX_TOKENS) for b in (1, 3, 16)]
    assert len({r["num_tokens"] for r in results}) == 1 and len({r["num_bytes"] for r in results}) == 1
    for other in results[1:]:
        assert other["val_bpb"] == pytest.approx(results[0]["val_bpb"], rel=1e-12)


def test_asking_for_more_tokens_than_exist_uses_what_exists(tokenizer, sample_home, prepare_module, tiny_models) -> None:
    result = prepare_module.evaluate_bpb(tiny_models.ZeroLogits(tokenizer.get_vocab_size()), tokenizer, 64,
                                         seq_len=512, max_tokens=10**9)
    rows = reference_windows(sample_home, 512, 10**9)
    assert 0 < result["num_tokens"] <= rows[:, 1:].size
    weights = reference_token_bytes(tokenizer)[rows[:, 1:]]
    assert result["num_bytes"] == int(weights.sum())


def test_timeout_stops_and_says_so(tokenizer, prepare_module, tiny_models) -> None:
    result = prepare_module.evaluate_bpb(tiny_models.ZeroLogits(tokenizer.get_vocab_size()), tokenizer, 4,
                                         seq_len=SEQ_LEN, max_tokens=MAX_TOKENS, timeout_seconds=-1)
    assert result["eval_over_timeout"] is True and result["num_tokens"] == 0
    assert result["eval_timeout"] == -1


def test_evaluate_restores_training_mode_and_uses_no_grad(tokenizer, prepare_module, tiny_models) -> None:
    model = tiny_models.RandomLogits(tokenizer.get_vocab_size())
    seen = []
    model.register_forward_hook(lambda module, inputs, output: seen.append((module.training, torch.is_grad_enabled())))
    model.train()
    prepare_module.evaluate_bpb(model, tokenizer, 8, seq_len=SEQ_LEN, max_tokens=512)
    assert seen and all(state == (False, False) for state in seen)
    assert model.training


def test_causality_check_passes_a_causal_model_and_flags_a_peeking_one(prepare_module, tiny_models) -> None:
    tokenizer = types.SimpleNamespace(get_vocab_size=lambda: 512)  # the check reads only the vocabulary size
    causal = prepare_module.causality_check(tiny_models.RandomLogits(512), tokenizer, 2, 32, "cpu")
    peeking = prepare_module.causality_check(tiny_models.RandomLogits(512, peek=True), tokenizer, 2, 32, "cpu")
    assert causal == {"passed": True, "max_abs_diff": 0.0}
    assert peeking["passed"] is False and peeking["max_abs_diff"] > 0


TWO_RANK_SCRIPT = """
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
from trnfrontier.runtime.prepare_loader import load_prepare
prepare = load_prepare({prepare!r})
dist.init_process_group("gloo")
torch.manual_seed(0)
generator = torch.Generator().manual_seed(7)
vocab = prepare.TOKENIZER_VOCAB_SIZE
a, b, c = torch.randn(vocab, generator=generator), torch.randn(vocab, generator=generator) * 2, torch.randn(vocab, generator=generator)
class Model(torch.nn.Module):
    def forward(self, x):
        return a[x].unsqueeze(-1) * b + c
tokenizer = prepare.ensure_tokenizer()
result = prepare.evaluate_bpb(Model(), tokenizer, 3, seq_len={seq_len}, max_tokens={max_tokens})
if dist.get_rank() == 0:
    open({out!r}, "w").write(json.dumps(result))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_give_the_same_number_as_one(tokenizer, prepare_module, tmp_path) -> None:
    out = tmp_path / "result.json"
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANK_SCRIPT.format(tests=str(Path(__file__).parent), prepare=str(Path(prepare_module.__file__)),
                                             seq_len=SEQ_LEN, max_tokens=MAX_TOKENS, out=str(out)))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    completed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    two = json.loads(out.read_text())

    generator = torch.Generator().manual_seed(7)
    vocab = prepare_module.TOKENIZER_VOCAB_SIZE
    a, b, c = torch.randn(vocab, generator=generator), torch.randn(vocab, generator=generator) * 2, torch.randn(vocab, generator=generator)

    class Model(torch.nn.Module):
        def forward(self, x):
            return a[x].unsqueeze(-1) * b + c

    one = prepare_module.evaluate_bpb(Model(), tokenizer, 3, seq_len=SEQ_LEN, max_tokens=MAX_TOKENS)
    assert two["num_tokens"] == one["num_tokens"] and two["num_bytes"] == one["num_bytes"]
    assert two["val_bpb"] == pytest.approx(one["val_bpb"], rel=1e-12)
