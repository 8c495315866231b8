"""runtime.compile: the auto rule, the cache location, and the compiled optimizer
updates against the eager ones (and torch's AdamW)."""

from __future__ import annotations

import pytest
import torch

from trnfrontier.runtime import compiling, muon
from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.muon import Muon
from trnfrontier.runtime.optim import AdamW, apply_schedule, build_optimizers
from trnfrontier.runtime.recipe import OptimSpec


@pytest.mark.parametrize(
    ("setting", "device", "env", "expected"),
    [
        ("auto", "cpu", {}, True),
        ("auto", "cuda", {}, True),
        ("auto", "neuron", {}, False),
        (True, "neuron", {}, True),
        (False, "cpu", {}, False),
        ("auto", "cpu", {"TRNF_COMPILE": "0"}, False),
        ("auto", "neuron", {"TRNF_COMPILE": "on"}, True),
        (True, "cpu", {"TRNF_COMPILE": "0"}, True),  # the override only moves auto
    ],
)
def test_compile_enabled(setting, device, env, expected) -> None:
    assert compiling.compile_enabled(setting, device, env) is expected


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="true, false or auto"):
        compiling.compile_enabled("sometimes", "cpu", {})


def test_cache_goes_under_the_data_home_unless_named(tmp_path) -> None:
    env = {"TRNF_HOME": str(tmp_path), "TRITON_CACHE_DIR": "/elsewhere"}
    root = compiling.use_cache_under_home(env)
    assert root == tmp_path / "compile"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile" / "inductor")
    assert env["TRITON_CACHE_DIR"] == "/elsewhere"


def _train(optimizers_of, steps: int = 3, after_step=lambda i: None) -> list[torch.Tensor]:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, sequence_len=8, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)
    model = GPT(config)
    opts = optimizers_of(model)
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        data = torch.randint(0, 64, (2, 9), generator=g)
        if any(isinstance(o, Muon) for o in opts):
            apply_schedule(opts, 1.0 - 0.3 * i, 0.85 + 0.05 * i)
        model.loss(data[:, :-1], data[:, 1:]).backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        after_step(i)
    return [p.detach().clone() for p in model.parameters()]


def test_our_adamw_steps_as_torchs() -> None:
    def ours(model):
        return [AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1)]

    def torchs(model):
        return [
            torch.optim.AdamW(
                model.parameters(), lr=0.01, betas=(0.8, 0.95), eps=1e-10, weight_decay=0.1
            )
        ]

    for a, b in zip(_train(ours), _train(torchs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_our_adamw_state_loads_into_torchs() -> None:
    model = GPT(
        GPTConfig(vocab_size=64, sequence_len=8, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)
    )
    ours = AdamW(model.parameters(), lr=0.01)
    model.loss(torch.zeros(1, 8, dtype=torch.long), torch.ones(1, 8, dtype=torch.long)).backward()
    ours.step()
    theirs = torch.optim.AdamW(model.parameters(), lr=0.01)
    theirs.load_state_dict(ours.state_dict())
    assert set(theirs.state[model.wte.weight]) == {"step", "exp_avg", "exp_avg_sq"}


def test_compiled_optimizer_updates_match_eager_without_recompiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """One compile per update function and shape: a moving LR/momentum schedule and fresh
    gradients every step reuse it (the guard failures a compiled ``opt.step`` would hit).
    Polar Express runs in float32 here: in bfloat16 (the default on a CPU that multiplies
    it) inductor rounds its fused epilogues in other places than eager does."""
    monkeypatch.setattr(muon, "CPU_POLAR_DTYPE", torch.float32)
    optim_cfg = OptimSpec(matrix_lr=0.02, muon_momentum_warmup_steps=10, weight_decay=0.05, normuon=True)
    eager = _train(lambda m: build_optimizers(m, optim_cfg))
    torch._dynamo.reset()

    def compiled(model):
        opts = build_optimizers(model, optim_cfg)
        assert compiling.compile_optimizers(opts, "cpu") == 2
        return opts

    compiles: list[int] = []  # frames dynamo has converted (compiled) after each step
    got = _train(
        compiled,
        steps=3,
        after_step=lambda i: compiles.append(torch._dynamo.utils.counters["frames"]["total"]),
    )
    for a, b in zip(got, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert compiles[0] > 0 and compiles[0] == compiles[-1], compiles
