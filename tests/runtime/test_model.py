"""The GPT: shapes, parameter accounting, and the properties the scorer relies on
(pure, causal, batch-independent logits)."""

from __future__ import annotations

import math

import pytest
import torch

from trnfrontier.runtime import ops
from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.recipe import ModelSpec, check_heads

torch.set_num_threads(1)

VOCAB = 256


def tiny_config(**overrides) -> GPTConfig:
    base = dict(vocab_size=VOCAB, sequence_len=32, n_layer=2, n_head=4, n_kv_head=4, n_embd=64)
    base.update(overrides)
    return GPTConfig(**base)


def make_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(tiny_config(**overrides))
    # Zero-initialised projections make blocks the identity; give them weights so the
    # tests below exercise attention and the MLP, not just embedding -> head.
    with torch.no_grad():
        for block in model.blocks:
            block.attn.c_proj.weight.normal_(0.0, 0.05)
            block.mlp.c_proj.weight.normal_(0.0, 0.05)
            if block.attn.ve_gate is not None:
                block.attn.ve_gate.weight.normal_(0.0, 0.5)
        model.lm_head.weight.normal_(0.0, 0.05)
    return model.eval()


# ---------------------------------------------------------------- config and shapes


def test_baseline_d10_has_exactly_59_637_760_parameters() -> None:
    config = GPTConfig.from_recipe(
        ModelSpec(depth=10, aspect_ratio=64, head_dim=128, vocab_size=8192, sequence_len=1024)
    )
    assert (config.n_layer, config.n_embd, config.n_head, config.n_kv_head, config.head_dim) == (
        10,
        640,
        5,
        5,
        128,
    )
    with torch.device("meta"):  # shapes only, no memory
        model = GPT(config)
    assert model.num_params() == 2 * 8192 * 640 + 10 * 12 * 640**2 == 59_637_760
    assert model.num_matmul_params() == 8192 * 640 + 10 * 12 * 640**2


def test_from_recipe_rounds_width_up_to_head_dim_and_honours_explicit_shapes() -> None:
    # 6 x 64 = 384 is 3 heads of 128; 5 x 50 = 250 rounds up to 256 = 2 heads of 128.
    assert GPTConfig.from_recipe(ModelSpec(depth=6, aspect_ratio=64, head_dim=128)).n_embd == 384
    c = GPTConfig.from_recipe(ModelSpec(depth=5, aspect_ratio=50, head_dim=128))
    assert (c.n_embd, c.n_head, c.n_kv_head) == (256, 2, 2)
    c = GPTConfig.from_recipe(ModelSpec(depth=2, n_embd=128, head_dim=32, n_kv_head=2, vocab_size=512))
    assert (c.n_embd, c.n_head, c.n_kv_head, c.head_dim, c.vocab_size) == (128, 4, 2, 32, 512)
    with pytest.raises(ValueError, match="n_kv_head"):
        GPTConfig.from_recipe(ModelSpec(depth=2, n_embd=128, head_dim=32, n_kv_head=3))


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (dict(n_embd=64, n_head=3, n_kv_head=3), "n_embd=64 is not a multiple of n_head=3"),
        (dict(n_embd=60, n_head=4, n_kv_head=4), r"head_dim=15 must be even"),
        (dict(n_embd=64, n_head=4, n_kv_head=3), r"n_kv_head=3 must divide n_head=4"),
    ],
)
def test_a_checkpoints_config_obeys_the_recipes_shape_rule(shape: dict, message: str) -> None:
    # One rule (recipe.check_heads) for a shape from a recipe and one from a checkpoint.
    with pytest.raises(ValueError, match=message):
        GPTConfig(vocab_size=VOCAB, sequence_len=32, n_layer=1, **shape)
    with pytest.raises(ValueError, match=message):
        check_heads(shape["n_embd"], shape["n_head"], shape["n_kv_head"])


def test_config_round_trips_through_dict_and_rejects_unknown_keys() -> None:
    config = tiny_config(n_kv_head=2, value_embeds=True, softcap=0.0)
    assert GPTConfig.from_dict(config.to_dict()) == config
    assert GPTConfig.from_dict({**config.to_dict(), "head_dim": config.head_dim}) == config
    with pytest.raises(ValueError, match="unknown GPTConfig keys: bogus"):
        GPTConfig.from_dict({**config.to_dict(), "bogus": 1})


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_gqa_and_mha_shapes(n_kv_head: int) -> None:
    model = make_model(n_kv_head=n_kv_head)
    head_dim = 16
    for block in model.blocks:
        assert block.attn.c_q.weight.shape == (4 * head_dim, 64)
        assert block.attn.c_k.weight.shape == (n_kv_head * head_dim, 64)
        assert block.attn.c_v.weight.shape == (n_kv_head * head_dim, 64)
    idx = torch.randint(0, VOCAB, (3, 20))
    logits = model(idx)
    assert logits.shape == (3, 20, VOCAB) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_gqa_equals_mha_with_kv_heads_repeated() -> None:
    """GQA is exactly MHA whose KV projections repeat each KV head's rows."""
    gqa = make_model(n_kv_head=2)
    mha = GPT(tiny_config(n_kv_head=4)).eval()
    state = gqa.state_dict()
    for i in range(2):
        for name in ("c_k", "c_v"):
            key = f"blocks.{i}.attn.{name}.weight"
            state[key] = state[key].view(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64)
    mha.load_state_dict(state)
    idx = torch.randint(0, VOCAB, (2, 16))
    torch.testing.assert_close(gqa(idx), mha(idx), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- what the scorer relies on


@pytest.mark.parametrize("value_embeds", [False, True])
def test_forward_is_causal(value_embeds: bool) -> None:
    model = make_model(value_embeds=value_embeds, n_kv_head=2)
    torch.manual_seed(1)
    idx = torch.randint(0, VOCAB, (2, 24))
    t = 11
    perturbed = idx.clone()
    perturbed[:, t + 1 :] = torch.randint(0, VOCAB, (2, 24 - t - 1))
    assert not torch.equal(idx, perturbed)
    with torch.no_grad():
        a, b = model(idx), model(perturbed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-6, rtol=0)
    # ...and the perturbation is visible afterwards (the test would catch a leak).
    assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 1e-3


def test_logits_of_a_row_do_not_depend_on_the_rest_of_the_batch() -> None:
    model = make_model(n_kv_head=2, value_embeds=True)
    torch.manual_seed(2)
    batch = torch.randint(0, VOCAB, (4, 24))
    with torch.no_grad():
        together = model(batch)
        for row in range(4):
            alone = model(batch[row : row + 1])
            torch.testing.assert_close(alone[0], together[row], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prefix_length", [0, 7])
def test_logits_after_a_shared_prefix_equal_the_forward_of_the_whole_rows(prefix_length: int) -> None:
    model = make_model(n_kv_head=2, value_embeds=True)
    torch.manual_seed(3)
    prefix = torch.randint(0, VOCAB, (2, prefix_length))
    rows = torch.randint(0, VOCAB, (5, 9))
    owner = torch.tensor([0, 0, 1, 1, 1])
    at_rows, at_cols = torch.tensor([0, 1, 2, 4, 4]), torch.tensor([0, 8, 3, 5, 6])
    with torch.no_grad():
        whole = model(torch.cat((prefix[owner], rows), dim=1))
        shared = model.logits_after_prefix(prefix, rows, owner, at_rows, at_cols)
        at = model.logits_at(torch.cat((prefix[owner], rows), dim=1), at_rows, at_cols + prefix_length)
    torch.testing.assert_close(shared, whole[at_rows, at_cols + prefix_length], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(at, whole[at_rows, at_cols + prefix_length], atol=1e-5, rtol=1e-5)


def test_forward_is_pure_repeated_calls_agree_and_no_grad_state() -> None:
    model = make_model()
    idx = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        first = model(idx)
        model(torch.randint(0, VOCAB, (5, 30)))  # an unrelated call in between
        second = model(idx)
    assert torch.equal(first, second)


def test_eval_context_longer_than_the_rotary_table_extends_it() -> None:
    model = make_model()
    precomputed = model.rotary_cos.size(-2)
    assert precomputed == 4 * model.config.sequence_len
    idx = torch.randint(0, VOCAB, (1, precomputed + 8))
    with torch.no_grad():
        long_logits = model(idx)
        short_logits = model(idx[:, :40])
    assert model.rotary_cos.size(-2) >= precomputed + 8
    torch.testing.assert_close(long_logits[:, :40], short_logits, atol=1e-5, rtol=1e-5)
    # Rotary buffers are derived data: never in a checkpoint.
    assert not any("rotary" in key for key in model.state_dict())


def test_rotary_rotates_pairs_like_complex_multiplication() -> None:
    torch.manual_seed(3)
    x = torch.randn(1, 2, 5, 8)
    angles = torch.randn(5, 4)
    cos, sin = angles.cos()[None, None], angles.sin()[None, None]
    y = ops.apply_rotary(x, cos, sin)
    z = torch.complex(x[..., :4], x[..., 4:]) * torch.exp(-1j * angles)
    torch.testing.assert_close(y, torch.cat((z.real, z.imag), dim=-1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # a rotation


# ---------------------------------------------------------------- initialisation and loss


def test_zero_init_projections_and_initial_loss_near_ln_vocab() -> None:
    torch.manual_seed(0)
    model = GPT(tiny_config(value_embeds=True))
    for block in model.blocks:
        assert torch.count_nonzero(block.attn.c_proj.weight) == 0
        assert torch.count_nonzero(block.mlp.c_proj.weight) == 0
    idx = torch.randint(0, VOCAB, (4, 32))
    targets = torch.randint(0, VOCAB, (4, 32))
    loss = model.loss(idx, targets)
    assert abs(loss.item() - math.log(VOCAB)) < 0.05


def test_loss_matches_cross_entropy_of_forward_and_ignores_minus_one() -> None:
    model = make_model()
    idx = torch.randint(0, VOCAB, (2, 16))
    targets = torch.randint(0, VOCAB, (2, 16))
    targets[0, :5] = -1
    logits = model(idx)
    per_token = model.loss(idx, targets, reduction="none")
    assert per_token.shape == (2, 16)
    assert torch.all(per_token[0, :5] == 0)
    expected = torch.nn.functional.cross_entropy(
        logits.view(-1, VOCAB), targets.view(-1), ignore_index=-1
    )
    torch.testing.assert_close(model.loss(idx, targets), expected)
    torch.testing.assert_close(model.loss(idx, targets, reduction="sum"), per_token.sum())


def test_softcap_bounds_logits_and_zero_disables_it() -> None:
    model = make_model(softcap=2.0)
    with torch.no_grad():
        model.lm_head.weight.mul_(1000)
        logits = model(torch.randint(0, VOCAB, (1, 8)))
    assert logits.abs().max() <= 2.0
    assert logits.abs().max() > 1.9
    uncapped = make_model(softcap=0.0)
    with torch.no_grad():
        uncapped.lm_head.weight.mul_(1000)
        assert uncapped(torch.randint(0, VOCAB, (1, 8))).abs().max() > 10


# ---------------------------------------------------------------- value embeddings


def test_value_embeddings_on_and_off() -> None:
    off = GPT(tiny_config(n_layer=3, n_kv_head=2))
    on = GPT(tiny_config(n_layer=3, n_kv_head=2, value_embeds=True))
    assert len(off.value_embeds) == 0 and all(b.attn.ve_gate is None for b in off.blocks)
    # Alternate layers, the last one always included: layers 0 and 2 of 3.
    assert sorted(on.value_embeds.keys()) == ["0", "2"]
    assert [b.attn.ve_gate is not None for b in on.blocks] == [True, False, True]
    kv_dim = 2 * 16
    extra = 2 * VOCAB * kv_dim + 2 * 2 * 32  # tables + gates (32 input channels -> n_kv_head)
    assert on.num_params() - off.num_params() == extra
    assert on.num_embedding_params() - off.num_embedding_params() == 2 * VOCAB * kv_dim
    # The value embeddings reach the logits: zeroing them changes the output.
    model = make_model(n_layer=3, n_kv_head=2, value_embeds=True)
    idx = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        before = model(idx)
        for ve in model.value_embeds.values():
            ve.weight.zero_()
        assert (model(idx) - before).abs().max() > 1e-4


# ---------------------------------------------------------------- accounting and groups


@pytest.mark.parametrize("value_embeds", [False, True])
def test_flops_per_token_by_hand(value_embeds: bool) -> None:
    model = GPT(tiny_config(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, value_embeds=value_embeds))
    # By hand: per layer q 64x64, k 32x64, v 32x64, proj 64x64, fc 256x64, mlp proj 64x256
    # (+ value-embedding gate 2x32 on layer 1 only), plus the head 256x64.
    per_layer = 64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 + 256 * 64 + 64 * 256
    gates = 2 * 32 if value_embeds else 0
    non_embedding = 2 * per_layer + gates + VOCAB * 64
    seq_len = 32
    expected = 6 * non_embedding + 12 * 2 * 4 * 16 * seq_len
    assert model.flops_per_token(seq_len) == expected
    assert model.num_matmul_params() == non_embedding


def test_param_groups_partition_the_parameters() -> None:
    model = GPT(tiny_config(n_kv_head=2, value_embeds=True))
    groups = model.param_groups()
    assert set(groups) == {"matrix", "embedding", "unembedding", "scalar"}
    ids = [id(p) for ps in groups.values() for p in ps]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert all(p.dim() == 2 for p in groups["matrix"])
    assert groups["unembedding"] == [model.lm_head.weight]
    assert groups["embedding"][0] is model.wte.weight and len(groups["embedding"]) == 1 + len(
        model.value_embeds
    )
    assert groups["scalar"] == []


# ---------------------------------------------------------------- ops dispatch


def test_ops_register_routes_model_calls_and_reset_restores() -> None:
    calls = []

    def counting_relu2(x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return ops.reference("relu_squared")(x)

    model = make_model()
    idx = torch.randint(0, VOCAB, (1, 8))
    reference = model(idx)
    try:
        ops.register("relu_squared", counting_relu2)
        torch.testing.assert_close(model(idx), reference)
        assert len(calls) == model.config.n_layer
    finally:
        ops.reset()
    assert ops.OPS["relu_squared"] is ops.reference("relu_squared")
    with pytest.raises(KeyError, match="unknown op"):
        ops.register("nope", counting_relu2)


def test_causal_attention_matches_explicit_masked_softmax() -> None:
    torch.manual_seed(4)
    q = torch.randn(2, 4, 6, 8)
    k = torch.randn(2, 2, 6, 8)
    v = torch.randn(2, 2, 6, 8)
    out = ops.causal_attention(q, k, v)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ kk.transpose(-1, -2) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(out, scores.softmax(-1) @ vv, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- agreement with the schema


def test_from_recipe_agrees_with_the_schema_on_every_shipped_recipe() -> None:
    """The runtime derives shapes without pydantic; it must match schema.py exactly."""
    from pathlib import Path

    loading = pytest.importorskip("trnfrontier.recipes.loading")
    recipes = sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml"))
    if not recipes:
        pytest.skip("no shipped recipes")
    for path in recipes:
        recipe = loading.load_recipe(path)
        config = GPTConfig.from_recipe(recipe.resolved().model)
        assert config.n_embd == recipe.model.resolved_n_embd(), path.name
        assert config.head_dim == recipe.model.head_dim, path.name
        assert config.n_layer == recipe.model.depth and config.vocab_size == recipe.model.vocab_size
        if path.stem == "baseline_d10":
            with torch.device("meta"):
                assert GPT(config).num_params() == 59_637_760


def test_from_recipe_matches_schema_derivation_over_many_shapes() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    schema = pytest.importorskip("trnfrontier.recipes.schema")

    @hypothesis.given(
        depth=st.integers(1, 24),
        aspect=st.integers(1, 128),
        head_dim=st.sampled_from([8, 16, 32, 64, 128]),
        kv_divisor=st.sampled_from([1, 2, 4]),
    )
    @hypothesis.settings(max_examples=40, deadline=None)
    def check(depth: int, aspect: int, head_dim: int, kv_divisor: int) -> None:
        section = schema.ModelSection(depth=depth, aspect_ratio=aspect, head_dim=head_dim)
        n_head = section.resolved_n_embd() // head_dim
        if n_head % kv_divisor:
            return
        section = schema.ModelSection(
            depth=depth, aspect_ratio=aspect, head_dim=head_dim, n_kv_head=n_head // kv_divisor
        )
        config = GPTConfig.from_recipe(ModelSpec(**section.model_dump()))
        assert config.n_embd == section.resolved_n_embd()
        assert config.n_embd >= depth * aspect and config.n_embd % head_dim == 0
        assert config.n_embd - depth * aspect < head_dim  # rounded up, not further
        assert (config.n_head, config.n_kv_head) == (n_head, n_head // kv_divisor)

    check()


def test_meta_construction_then_to_empty_and_init_weights_gives_a_working_model() -> None:
    """init_weights() is a function of the RNG state when it is called, whatever the
    construction path (module constructors draw their own default inits first)."""
    config = tiny_config(n_kv_head=2)
    reference = GPT(config)
    torch.manual_seed(0)
    reference.init_weights()
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()  # also rebuilds the non-persistent rotary tables
    idx = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), reference(idx))
