"""profile's FLOP count against a hand computation, and the MFU arithmetic around it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trnfrontier.profiling import flops, measure
from trnfrontier.recipes.loading import validate_recipe

torch.set_num_threads(1)

TINY = {
    "name": "tiny",
    "model": {"depth": 2, "n_embd": 64, "head_dim": 16, "n_kv_head": 2, "vocab_size": 512, "sequence_len": 64},
    "data": {"batch_size": 2},
    "runtime": {"device": "cpu", "dtype": "float32", "threads": 1},
    "budget": {"seconds": 120, "checkpoint_reserve_seconds": 5},
}


def hand_flops_per_token() -> int:
    """d=64, 4 query heads of 16, 2 KV heads, MLP 4x, vocab 512, T=64, two layers."""
    d, kv, hidden, vocab, layers, T = 64, 2 * 16, 4 * 64, 512, 2, 64
    per_block = d * d + d * kv + d * kv + d * d + d * hidden + hidden * d  # q, k, v, proj, fc, mlp proj
    assert per_block == 45_056
    non_embedding = layers * per_block + d * vocab  # + the untied lm head; wte costs no matmul
    dense = 6 * non_embedding  # 2 FLOPs per weight forward, 4 backward
    attention = 12 * layers * 4 * 16 * T  # QK^T and AV, forward and backward, full T x T
    return dense + attention


@pytest.fixture(scope="module")
def profiled() -> dict:
    recipe = validate_recipe(TINY, "tiny")
    return measure.profile(measure.build(recipe), steps=2, warmup=1, top=5)


def test_flops_per_token_equals_the_hand_computation(profiled: dict) -> None:
    assert hand_flops_per_token() == 835_584
    assert profiled["flops_per_token"] == hand_flops_per_token()
    assert profiled["flops_terms"] == {"n_layer": 2, "n_head": 4, "head_dim": 16, "seq_len": 64}
    assert "6 x (params - embedding params)" in profiled["flops_formula"]


def test_achieved_flops_and_mfu_follow_from_the_measurement(profiled: dict) -> None:
    achieved = profiled["flops_per_token"] * profiled["tokens_per_second"]
    assert profiled["achieved_tflops"] == pytest.approx(achieved / 1e12)
    assert profiled["mfu"] == pytest.approx(achieved / (profiled["peak_tflops"] * 1e12))
    assert "measured" in profiled["peak_source"] and "probe" in profiled["peak_source"]


def test_projection_arithmetic(profiled: dict) -> None:
    p = profiled["projection"]
    assert p["train_seconds"] == 115
    assert p["tokens"] == pytest.approx(profiled["tokens_per_second"] * 115)
    assert p["steps"] == pytest.approx(p["tokens"] / (2 * 64))
    assert p["tokens_per_param"] == pytest.approx(p["tokens"] / profiled["params"])


def test_peak_table_for_accelerators() -> None:
    # torch.device("neuron") needs torch-neuronx; the peak only reads the device type.
    device = SimpleNamespace(type="neuron")
    neuron = flops.device_peak(device, torch.bfloat16, lnc=2)
    assert neuron.flops == pytest.approx(667e12 / 4) and "LNC=2" in neuron.source
    assert flops.device_peak(device, torch.bfloat16, lnc=1).flops == pytest.approx(667e12 / 8)
    assert flops.mfu(1e6, 1e6, flops.Peak(None, "unknown")) is None
    assert flops.mfu(1e6, 1e6, flops.Peak(4e12, "x")) == pytest.approx(0.25)
