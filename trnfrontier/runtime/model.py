"""A nanochat-style GPT: the model a submission trains and the scorer evaluates.

- token embedding and an untied lm head;
- parameter-free RMSNorm: after the embedding, before attention and MLP (pre-norm), on
  queries and keys (QK-norm), and before the head;
- rotary position embeddings, causal attention with grouped-query attention;
- ReLU^2 MLP, logit softcap ``cap * tanh(logits / cap)``;
- output projections (attention and MLP ``c_proj``) start at zero, so every block starts
  as the identity and the initial loss is about ln(vocab);
- optional value embeddings: a per-token vector mixed into the attention values of
  alternate layers through a small input-dependent gate.

``forward(idx)`` returns float32 logits and nothing else: it is pure, stateless and
causal, which is what ``evaluate_bpb`` and ``load_for_eval`` rely on. The training loss
is the explicit second method ``loss(idx, targets)``.

Elementwise and fused pieces go through ``trnfrontier.runtime.ops`` so that NKI kernels
can replace them without touching this file.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from trnfrontier.runtime import ops
from trnfrontier.runtime.recipe import ModelSpec, check_heads

# The value-embedding gate reads only the first channels of the block input: a cheap,
# input-dependent scalar per KV head.
VE_GATE_CHANNELS = 32
# Rotary tables cover this many training contexts up front (eval may use longer ones).
ROTARY_CONTEXT_FACTOR = 4


# The model knobs' defaults (runtime/recipe.py ModelSpec) for a config written without
# them (a kit's final.pt, older checkpoints).
_MODEL = ModelSpec()


@dataclass
class GPTConfig:
    """The model's shape as a checkpoint records it (``model_config``): the recipe's knobs
    resolved by ``recipe.model_shape``, checked by ``recipe.check_heads``."""

    vocab_size: int
    sequence_len: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    mlp_ratio: int = _MODEL.mlp_ratio
    softcap: float = _MODEL.softcap
    value_embeds: bool = _MODEL.value_embeds
    rope_base: float = _MODEL.rope_base

    def __post_init__(self) -> None:
        check_heads(self.n_embd, self.n_head, self.n_kv_head)
        if self.softcap < 0:
            raise ValueError(f"softcap={self.softcap} must be >= 0 (0 disables it)")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        data = dict(data)
        # head_dim is derived; accept it when a writer included it, but it must agree.
        head_dim = data.pop("head_dim", None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown GPTConfig keys: {', '.join(unknown)}")
        config = cls(**data)
        if head_dim is not None and head_dim != config.head_dim:
            raise ValueError(f"head_dim={head_dim} disagrees with n_embd/n_head={config.head_dim}")
        return config

    @classmethod
    def from_recipe(cls, model: ModelSpec) -> GPTConfig:
        """The shape of a resolved recipe's ``model`` section (``recipe.model_shape``, the
        derivation the schema validates with)."""
        n_embd, n_head, n_kv_head = model.shape()
        return cls(
            vocab_size=model.vocab_size,
            sequence_len=model.sequence_len,
            n_layer=model.depth,
            n_head=n_head,
            n_kv_head=n_kv_head,
            n_embd=n_embd,
            mlp_ratio=model.mlp_ratio,
            softcap=model.softcap,
            value_embeds=model.value_embeds,
            rope_base=model.rope_base,
        )


def has_value_embed(layer_idx: int, n_layer: int) -> bool:
    """Alternate layers carry a value embedding, always including the last one."""
    return layer_idx % 2 == (n_layer - 1) % 2


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        kv_dim = self.n_kv_head * self.head_dim
        self.c_q = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=False)
        self.c_k = nn.Linear(config.n_embd, kv_dim, bias=False)
        self.c_v = nn.Linear(config.n_embd, kv_dim, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.ve_gate_channels = min(VE_GATE_CHANNELS, config.n_embd)
        self.ve_gate = (
            nn.Linear(self.ve_gate_channels, self.n_kv_head, bias=False)
            if config.value_embeds and has_value_embed(layer_idx, config.n_layer)
            else None
        )

    def _project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v [B, T, heads * D] from one matmul against the three weights stacked:
        one wide product costs less than three narrow ones (the weights stay separate
        parameters, so checkpoints and the optimizer see c_q, c_k and c_v as before)."""
        weight = torch.cat((self.c_q.weight, self.c_k.weight, self.c_v.weight))
        qkv = ops.linear(x, weight)
        kv_dim = self.n_kv_head * self.head_dim
        q, k, v = qkv.split((self.n_head * self.head_dim, kv_dim, kv_dim), dim=-1)
        return q, k, v

    def forward(self, x: Tensor, ve: Tensor | None, cos: Tensor, sin: Tensor) -> Tensor:
        """Causal attention over ``x`` [B, T, C]."""
        q, k, v = self.heads(x, ve, cos, sin)
        y = ops.causal_attention(q, k, v).transpose(1, 2).reshape(x.size(0), x.size(1), -1)
        return ops.linear(y, self.c_proj.weight)

    def heads(self, x: Tensor, ve: Tensor | None, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [B, H, T, D] and k, v [B, Hkv, T, D] of ``x``: projected, value-embedded,
        rotated and normed, ready for attention."""
        B, T, _ = x.shape
        # [B, T, H*D] -> [B, H, T, D]
        q, k, v = self._project_qkv(x)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None and self.ve_gate is not None:
            # Gate in (0, 2), exactly 1 at initialisation (zero gate weights).
            gate = 2.0 * torch.sigmoid(self.ve_gate(x[..., : self.ve_gate_channels]))
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_kv_head, self.head_dim)
        v = v.transpose(1, 2)
        return ops.rotary_rms_norm(q, cos, sin), ops.rotary_rms_norm(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        hidden = config.mlp_ratio * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=False)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return ops.linear(ops.relu_squared(ops.linear(x, self.c_fc.weight)), self.c_proj.weight)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(config, layer_idx)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, ve: Tensor | None, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attn(ops.rms_norm(x), ve, cos, sin)
        return x + self.mlp(ops.rms_norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        kv_dim = config.n_kv_head * config.head_dim
        self.value_embeds = nn.ModuleDict(
            {
                str(i): nn.Embedding(config.vocab_size, kv_dim)
                for i in range(config.n_layer)
                if config.value_embeds and has_value_embed(i, config.n_layer)
            }
        )
        # Non-persistent: derived from the config, never stored in checkpoints.
        self.register_buffer("rotary_cos", torch.empty(0), persistent=False)
        self.register_buffer("rotary_sin", torch.empty(0), persistent=False)
        self.init_weights()

    # ------------------------------------------------------------------ initialisation

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and the rotary tables.

        Call it again after ``to_empty()`` from a meta-device construction: it also
        rebuilds the non-persistent rotary buffers on the parameters' device.
        """
        c = self.config
        nn.init.normal_(self.wte.weight, mean=0.0, std=1.0)
        # A small head keeps the initial logits near zero: loss starts at ~ln(vocab).
        nn.init.normal_(self.lm_head.weight, mean=0.0, std=0.001)
        # Uniform with the same std as normal(0, n_embd^-0.5), without the outliers.
        bound = math.sqrt(3.0) * c.n_embd**-0.5
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                nn.init.uniform_(lin.weight, -bound, bound)
            # Zero output projections: each block starts as the identity.
            nn.init.zeros_(block.attn.c_proj.weight)
            nn.init.zeros_(block.mlp.c_proj.weight)
            if block.attn.ve_gate is not None:
                nn.init.zeros_(block.attn.ve_gate.weight)
        for ve in self.value_embeds.values():
            nn.init.uniform_(ve.weight, -bound, bound)
        self.init_rotary(c.sequence_len * ROTARY_CONTEXT_FACTOR)

    @torch.no_grad()
    def init_rotary(self, length: int) -> None:
        """Precompute rotary cos/sin for positions [0, length) as [1, 1, length, D/2]."""
        c = self.config
        device = self.wte.weight.device
        half = c.head_dim // 2
        inv_freq = 1.0 / (
            c.rope_base ** (torch.arange(0, half, dtype=torch.float32, device=device) / half)
        )
        t = torch.arange(length, dtype=torch.float32, device=device)
        freqs = torch.outer(t, inv_freq)
        self.rotary_cos = freqs.cos()[None, None]
        self.rotary_sin = freqs.sin()[None, None]

    # ------------------------------------------------------------------ forward

    def forward(self, idx: Tensor) -> Tensor:
        """Token ids [B, T] -> float32 logits [B, T, vocab]. Pure, stateless, causal."""
        return self.head(self._final_hidden(idx))

    def logits_at(self, idx: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
        """float32 logits [N, vocab] at positions ``(rows[i], cols[i])`` of ``idx`` [B, T]:
        ``forward(idx)[rows, cols]`` without the lm head at the other positions (CORE
        scores a few positions of long prompts; the head is most of a small model)."""
        return self.head(self._final_hidden(idx)[rows, cols])

    def head(self, hidden: Tensor) -> Tensor:
        """float32 logits [..., vocab] of final hidden states (normed), softcapped."""
        logits = ops.linear(hidden, self.lm_head.weight).float()
        if self.config.softcap > 0:
            logits = ops.softcap(logits, self.config.softcap)
        return logits

    def logits_after_prefix(
        self, prefix: Tensor, rows: Tensor, owner: Tensor, at_rows: Tensor, at_cols: Tensor
    ) -> Tensor:
        """float32 logits [N, vocab] of the sequences ``prefix[owner[r]] + rows[r]`` (prefix
        [G, P], rows [R, S]) at positions ``(at_rows[i], P + at_cols[i])``: what ``forward``
        gives there, with each prefix row computed once however many rows continue it (the
        choices of one question after its shared context)."""
        lengths = torch.full((prefix.size(0),), prefix.size(1), dtype=torch.long, device=prefix.device)
        return self.logits_ragged(prefix, lengths, rows, owner, at_rows, at_cols)

    def logits_ragged(
        self, prefix: Tensor, prefix_lengths: Tensor, rows: Tensor, owner: Tensor, at_rows: Tensor, at_cols: Tensor
    ) -> Tensor:
        """``logits_after_prefix`` with prefix row g cut to its first ``prefix_lengths[g]``
        tokens, computing only the tokens the scored positions need (``ragged_forward``)."""
        return self.head(self.hidden_ragged(prefix, prefix_lengths, rows, owner, at_rows, at_cols))

    def hidden_ragged(
        self, prefix: Tensor, prefix_lengths: Tensor, rows: Tensor, owner: Tensor, at_rows: Tensor, at_cols: Tensor
    ) -> Tensor:
        """The head's input [N, n_embd] at the positions ``logits_ragged`` gives logits for
        (a caller can then run the head over a few positions at a time)."""
        try:
            from trnfrontier.runtime.ragged_forward import hidden_ragged
        except ImportError:  # a single-file training script leaves CORE's scoring forward out
            return self._hidden_whole(prefix, prefix_lengths, rows, owner, at_rows, at_cols)
        return hidden_ragged(self, prefix, prefix_lengths, rows, owner, at_rows, at_cols)

    def _hidden_whole(
        self, prefix: Tensor, prefix_lengths: Tensor, rows: Tensor, owner: Tensor, at_rows: Tensor, at_cols: Tensor
    ) -> Tensor:
        """``hidden_ragged`` by the plain forward over each whole sequence (right-padded:
        causal, so the padding is never read at a scored position)."""
        lengths = prefix_lengths.to(rows.device).index_select(0, owner)
        idx = rows.new_zeros((rows.size(0), prefix.size(1) + rows.size(1)))
        for r, n in enumerate(lengths.tolist()):
            idx[r, :n] = prefix[owner[r], :n]
            idx[r, n : n + rows.size(1)] = rows[r]
        return self._final_hidden(idx)[at_rows, lengths.index_select(0, at_rows) + at_cols]

    def _rotary(self, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos, sin [1, 1, length, D/2] for positions 0 .. length - 1."""
        if self.rotary_cos.size(-2) < length or self.rotary_cos.device != device:
            # A longer eval context than precomputed: extend the tables once.
            self.init_rotary(max(length, self.config.sequence_len * ROTARY_CONTEXT_FACTOR))
        return self.rotary_cos[:, :, :length], self.rotary_sin[:, :, :length]

    def _value_embed(self, layer: int, idx: Tensor) -> Tensor | None:
        key = str(layer)
        return self.value_embeds[key](idx) if key in self.value_embeds else None

    def _final_hidden(self, idx: Tensor) -> Tensor:
        """The normalised last hidden state [B, T, n_embd], the head's input."""
        cos, sin = self._rotary(idx.size(1), idx.device)
        x = ops.rms_norm(self.wte(idx))
        for i, block in enumerate(self.blocks):
            x = block(x, self._value_embed(i, idx), cos, sin)
        return ops.rms_norm(x)

    def loss(self, idx: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
        """Cross-entropy (float32, nats) of ``forward(idx)`` against ``targets``;
        targets equal to -1 are ignored. ``reduction="none"`` returns [B, T]."""
        # The head, softcap and cross-entropy are one op: the default (fused_loss) never
        # holds the full [B*T, vocab] logits; it equals cross_entropy(forward(idx)).
        return ops.linear_softcapped_cross_entropy(
            self._final_hidden(idx), self.lm_head.weight, targets, self.config.softcap, ignore_index=-1, reduction=reduction
        )

    # ------------------------------------------------------------------ accounting

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def num_embedding_params(self) -> int:
        """Lookup tables (token and value embeddings): parameters that cost no matmul."""
        return self.wte.weight.numel() + sum(ve.weight.numel() for ve in self.value_embeds.values())

    def num_matmul_params(self) -> int:
        """Weights of the blocks' matrices plus the lm head (embeddings excluded)."""
        blocks = sum(p.numel() for p in self.blocks.parameters() if p.dim() == 2)
        return blocks + self.lm_head.weight.numel()

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward), the nanochat / PaLM estimate:

            6 * (num_params - embedding params) + 12 * n_layer * n_head * head_dim * seq_len

        The first term is 2 FLOPs per weight per token forward and 4 backward; the second
        is the attention scores and weighted sum (QK^T and AV, forward and backward),
        counted for the full T x T square as is conventional.
        """
        c = self.config
        dense = 6 * (self.num_params() - self.num_embedding_params())
        attention = 12 * c.n_layer * c.n_head * c.head_dim * seq_len
        return int(dense + attention)

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by optimizer role: ``matrix`` (2-D block weights, Muon),
        ``embedding`` (token and value embeddings), ``unembedding`` (lm head) and
        ``scalar`` (everything else, AdamW). Every parameter is in exactly one list."""
        matrix = [p for p in self.blocks.parameters() if p.dim() == 2]
        embedding = [self.wte.weight, *(ve.weight for ve in self.value_embeds.values())]
        unembedding = [self.lm_head.weight]
        taken = {id(p) for p in (*matrix, *embedding, *unembedding)}
        scalar = [p for p in self.parameters() if id(p) not in taken]
        return {
            "matrix": matrix,
            "embedding": embedding,
            "unembedding": unembedding,
            "scalar": scalar,
        }
