"""Kernels in training: the model with its pieces routed through the trnf:: custom ops
trains like the plain PyTorch model (the failure mode teams hit: a kernel that passed
in isolation and broke the run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trnfrontier.runtime import muon, ops
from trnfrontier.runtime.kernels import register_ops, reset_kernels
from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.optim import build_optimizers
from trnfrontier.runtime.recipe import OptimSpec, ResolvedRecipe

REPO = Path(__file__).resolve().parents[2]


def _cpu_smoke() -> ResolvedRecipe:
    from trnfrontier.recipes.loading import load_recipe

    return load_recipe(REPO / "recipes" / "cpu_smoke.yaml").resolved()


def _train(
    config: GPTConfig, optim_cfg: OptimSpec, routed: bool, steps: int, batch: int, seq: int
) -> list[float]:
    reset_kernels()
    if routed:
        register_ops()
    torch.manual_seed(0)
    model = GPT(config)
    optimizers = build_optimizers(model, optim_cfg)
    # one fixed batch, seen every step: the loss must fall, so "same loss" is not vacuous
    tokens = torch.randint(
        0, config.vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(1)
    )
    losses = []
    for _ in range(steps):
        loss = model.loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    reset_kernels()
    return losses


def test_cpu_smoke_steps_through_custom_ops_match_plain_pytorch() -> None:
    cfg = _cpu_smoke()
    config = GPTConfig.from_recipe(cfg.model)
    plain = _train(config, cfg.optim, routed=False, steps=3, batch=2, seq=32)
    routed = _train(config, cfg.optim, routed=True, steps=3, batch=2, seq=32)
    assert plain[-1] < plain[0] - 0.1
    torch.testing.assert_close(torch.tensor(routed), torch.tensor(plain), rtol=2e-4, atol=2e-4)


def test_tiny_model_loss_and_grads_with_kernels_interpreted(interpreter_backend) -> None:
    """Every model piece runs its NKI kernel (in the interpreter): same loss and grads."""
    config = GPTConfig(vocab_size=512, sequence_len=40, n_layer=1, n_head=2, n_kv_head=1, n_embd=64)
    torch.manual_seed(0)
    model = GPT(config)
    tokens = torch.randint(0, 512, (2, 41))

    def loss_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = model.loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        return loss.detach(), {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }

    ops.reset()
    want_loss, want_grads = loss_and_grads()
    register_ops()
    assert ops.OPS["causal_attention"] is not ops.reference("causal_attention")
    got_loss, got_grads = loss_and_grads()
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    assert got_grads.keys() == want_grads.keys()
    for name in want_grads:
        torch.testing.assert_close(
            got_grads[name], want_grads[name], rtol=1e-3, atol=1e-5, msg=name
        )


@pytest.mark.slow
def test_cpu_smoke_longer_run_through_custom_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    # Muon's Polar Express in float32: in bfloat16 its roundings amplify the other ops'
    # float32 summation-order differences over 20 steps beyond what this compares.
    monkeypatch.setattr(muon, "CPU_POLAR_DTYPE", torch.float32)
    cfg = _cpu_smoke()
    config = GPTConfig.from_recipe(cfg.model)
    plain = _train(config, cfg.optim, routed=False, steps=20, batch=4, seq=128)
    routed = _train(config, cfg.optim, routed=True, steps=20, batch=4, seq=128)
    assert plain[-1] < plain[0] - 1.0
    torch.testing.assert_close(torch.tensor(routed), torch.tensor(plain), rtol=1e-3, atol=1e-3)
