"""build_optimizers / apply_schedule on the real model, and seeded determinism."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.muon import Muon
from trnfrontier.runtime.optim import apply_schedule, build_optimizers, clip_grad_norm
from trnfrontier.runtime.recipe import OptimSpec

torch.set_num_threads(1)

# The recipe's optim section as `trnf train` resolves it by default.
OPTIM = OptimSpec()


def tiny_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    base = dict(vocab_size=128, sequence_len=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32)
    base.update(overrides)
    return GPT(GPTConfig(**base))


def train(model: GPT, optim: OptimSpec, steps: int, seed: int = 0) -> list[float]:
    """A repeating-pattern task a tiny model learns in a few steps."""
    optimizers = build_optimizers(model, optim)
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 128, (4, 17), generator=g)
    losses = []
    for _ in range(steps):
        loss = model.loss(data[:, :-1], data[:, 1:])
        loss.backward()
        clip_grad_norm(model.parameters(), optim.grad_clip)
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        apply_schedule(optimizers, 1.0, 0.95)
        losses.append(loss.item())
    return losses


def test_groups_lrs_and_betas_follow_the_recipe() -> None:
    model = tiny_model(value_embeds=True)
    adamw, muon = build_optimizers(model, OPTIM)
    assert isinstance(adamw, torch.optim.AdamW) and isinstance(muon, Muon)
    scale = (32 / 768) ** -0.5
    by_name = {g["name"]: g for g in adamw.param_groups}
    assert set(by_name) == {"embedding", "unembedding"}  # no scalar params: group left out
    assert by_name["embedding"]["lr"] == pytest.approx(0.2 * scale)
    assert by_name["unembedding"]["initial_lr"] == pytest.approx(0.004 * scale)
    assert adamw.defaults["betas"] == (0.8, 0.95) and adamw.defaults["eps"] == 1e-10
    assert all(g["weight_decay"] == 0.0 for g in adamw.param_groups)
    assert adamw.defaults["fused"] in (False, None)
    assert len(by_name["embedding"]["params"]) == 1 + len(model.value_embeds)
    (mgroup,) = muon.param_groups
    assert mgroup["initial_lr"] == 0.02 and mgroup["lr"].item() == pytest.approx(0.02)
    # Momentum starts at the warm-up start; the trainer moves it with apply_schedule.
    assert mgroup["momentum"].item() == pytest.approx(0.85)
    # Every parameter is optimised exactly once.
    ids = [id(p) for opt in (adamw, muon) for g in opt.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())


def test_width_scaling_off_keeps_recipe_lrs() -> None:
    adamw, _ = build_optimizers(tiny_model(), dataclasses.replace(OPTIM, lr_width_scaling=False))
    assert {g["name"]: g["lr"] for g in adamw.param_groups} == {
        "embedding": 0.2,
        "unembedding": 0.004,
    }


def test_apply_schedule_sets_lr_from_initial_and_muon_momentum_in_place() -> None:
    optimizers = build_optimizers(tiny_model(), OPTIM)
    muon = optimizers[1]
    lr_tensor, mom_tensor = muon.param_groups[0]["lr"], muon.param_groups[0]["momentum"]
    apply_schedule(optimizers, 0.25, 0.9)
    for opt in optimizers:
        for group in opt.param_groups:
            lr = group["lr"]
            assert float(lr) == pytest.approx(group["initial_lr"] * 0.25)
    assert (
        muon.param_groups[0]["lr"] is lr_tensor and muon.param_groups[0]["momentum"] is mom_tensor
    )
    assert mom_tensor.item() == pytest.approx(0.9)
    assert float(lr_tensor) == pytest.approx(0.005)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"normuon": True},
        {"weight_decay": 0.05, "cautious_weight_decay": True},
        {"grad_clip": 1.0},
    ],
)
def test_muon_plus_adamw_reduce_the_loss_of_the_model(overrides: dict) -> None:
    model = tiny_model(value_embeds=True)
    losses = train(model, dataclasses.replace(OPTIM, **overrides), steps=25)
    assert abs(losses[0] - math.log(128)) < 0.1
    assert losses[-1] < 0.5 * losses[0]
    assert all(math.isfinite(x) for x in losses)


def test_adamw_alone_reduces_the_loss_on_embeddings_and_head() -> None:
    model = tiny_model()
    adamw, _ = build_optimizers(model, OPTIM)
    data = torch.randint(0, 128, (4, 17), generator=torch.Generator().manual_seed(1))
    first = None
    for _ in range(20):
        loss = model.loss(data[:, :-1], data[:, 1:])
        loss.backward()
        adamw.step()
        model.zero_grad(set_to_none=True)
        first = first if first is not None else loss.item()
    assert loss.item() < 0.8 * first


def test_two_seeded_runs_give_identical_losses_on_cpu() -> None:
    a = train(tiny_model(seed=7, value_embeds=True), dataclasses.replace(OPTIM, normuon=True), steps=6)
    b = train(tiny_model(seed=7, value_embeds=True), dataclasses.replace(OPTIM, normuon=True), steps=6)
    assert a == b


def test_clip_grad_norm_clips_and_zero_disables() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([3.0, 4.0, 0.0])
    assert clip_grad_norm([p], 0.0) is None
    assert torch.equal(p.grad, torch.tensor([3.0, 4.0, 0.0]))
    norm = clip_grad_norm([p], 1.0)
    assert norm.item() == pytest.approx(5.0)
    assert p.grad.norm().item() == pytest.approx(1.0, rel=1e-4)


def test_lrs_follow_the_batch_by_the_square_root_rule() -> None:
    from trnfrontier.runtime.optim import batch_lr_scale

    cfg = dataclasses.replace(OPTIM, lr_batch_scaling=True, reference_batch_tokens=524_288)
    assert batch_lr_scale(8192, cfg) == pytest.approx(0.125)  # 64x smaller batch: 1/8 the LR
    assert batch_lr_scale(524_288, cfg) == 1.0
    assert batch_lr_scale(8192, dataclasses.replace(cfg, lr_batch_scaling=False)) == 1.0
    assert batch_lr_scale(None, cfg) == 1.0
    plain = {g["name"]: g["initial_lr"] for o in build_optimizers(tiny_model(), cfg) for g in o.param_groups}
    scaled = {g["name"]: g["initial_lr"] for o in build_optimizers(tiny_model(), cfg, 8192) for g in o.param_groups}
    assert set(plain) == set(scaled) and "matrix" in scaled
    for name, lr in plain.items():
        assert scaled[name] == pytest.approx(lr * 0.125)
