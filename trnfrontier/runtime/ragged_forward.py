"""The GPT's logits at chosen positions of many sequences, computing only the tokens needed.

CORE (and any scorer of continuations) asks for the logits at a few positions of many
token sequences, each of them a prefix shared by several sequences followed by a tail of
its own (the choices of one question after its context). ``GPT.forward`` over a padded
[rows, length] batch computes every row's whole prefix and its padding; this forward
computes each needed token once:

- every prefix token once for all the rows that continue it, each prefix with its own
  length (``prefix_lengths``): one question's context is not cut to the batch's shortest;
- no padding in any linear layer: the tokens travel as one flat [tokens, channels] tensor
  and only attention sees them padded, scattered into [rows, length] and gathered back;
- a tail only up to its last scored position (what comes after is never read, causally);
- in the last layer, the prefixes only lend keys and values, and only the scored positions
  go on through the attention projection, the MLP and the head.

Each logit is what ``forward`` gives at that position up to float rounding: the same
weights and the same operations, in other batch shapes (~1e-6 in float32).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from trnfrontier.runtime import ops

# The model (runtime/model.py's GPT, which calls this module) and its attention layers are
# typed Any here: importing model.py for their names would make the two import each other.


@dataclass(frozen=True)
class Layout:
    """Where the flat tokens go: prefix tokens first (``n_prefix``), then tail tokens.

    Attention reads them through gathers: ``prefix_gather`` [G * Pmax] and ``tail_gather``
    [R * Tmax] name the flat token in each padded slot, ``key_gather`` [R * (Pmax + Tmax)]
    the flat token each tail row sees at each key slot (its own prefix, then its own
    tail). A padding slot names token 0: its key is masked and its output dropped, so any
    finite values do. ``prefix_slots`` / ``tail_slots`` bring the outputs back.
    """

    ids: Tensor  # [N] token ids, flat
    positions: Tensor  # [N] each token's position in its whole sequence
    span: int  # one past the largest position: the rotary table's length
    n_prefix: int
    prefix_slots: Tensor  # [Np] each prefix token's slot in the padded [G * Pmax]
    tail_slots: Tensor  # [Nt] each tail token's slot in the padded [R * Tmax]
    prefix_gather: Tensor
    tail_gather: Tensor
    key_gather: Tensor
    prefix_shape: tuple[int, int]  # (G, Pmax)
    tail_shape: tuple[int, int]  # (R, Tmax)
    tail_visible: Tensor | None  # [R, 1, Tmax, Pmax + Tmax]: the keys each tail query sees (None: no prefix)
    scored: Tensor  # [M] the flat tail index (0 .. Nt - 1) of each scored position
    # The last layer's queries, only the scored positions: per row r its scored columns
    # padded to Qmax (``query_gather`` [R * Qmax], flat token indices), where each scored
    # position's output lands (``query_slots`` [M]), and the keys each query sees
    # (``query_visible`` [R, 1, Qmax, Pmax + Tmax] over the ``key_gather`` keys, or over
    # the tail's own keys [.., Tmax] when there is no prefix).
    query_gather: Tensor
    query_slots: Tensor
    query_visible: Tensor


    def to(self, device: torch.device) -> Layout:
        """The same layout with its tensors on ``device``."""
        moved = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return Layout(**{name: value.to(device) if isinstance(value, Tensor) else value for name, value in moved.items()})


def _gather_map(valid: Tensor, offset: int) -> Tensor:
    """For each slot of a padded [B, L] ``valid`` mask, its flat token index (tokens counted
    row by row from ``offset``), 0 for padding."""
    index = torch.zeros(valid.numel(), dtype=torch.long, device=valid.device)
    slots = valid.flatten().nonzero().squeeze(1)
    index[slots] = torch.arange(slots.numel(), device=valid.device) + offset
    return index


def layout(prefix: Tensor, prefix_lengths: Tensor, rows: Tensor, owner: Tensor, at_rows: Tensor, at_cols: Tensor) -> Layout:
    """The flat layout of ``prefix[g, :prefix_lengths[g]]`` and, per row r, ``rows[r]`` up
    to its last scored column (``at_cols`` counts from the tail's start)."""
    G, P = prefix.shape
    R = rows.size(0)
    device = rows.device
    prefix_lengths = prefix_lengths.to(device=device, dtype=torch.long)
    tail_lengths = torch.zeros(R, dtype=torch.long, device=device).scatter_reduce(0, at_rows, at_cols + 1, reduce="amax")
    T = int(tail_lengths.max().item()) if R else 0
    prefix_valid = torch.arange(P, device=device) < prefix_lengths[:, None]
    tail_valid = torch.arange(T, device=device) < tail_lengths[:, None]
    prefix_slots, tail_slots = prefix_valid.flatten().nonzero().squeeze(1), tail_valid.flatten().nonzero().squeeze(1)
    n_prefix = prefix_slots.numel()
    prefix_gather, tail_gather = _gather_map(prefix_valid, 0), _gather_map(tail_valid, n_prefix)
    # Every tail token's position follows its own prefix.
    own_prefix = prefix_lengths.index_select(0, owner)
    tail_positions = own_prefix.repeat_interleave(tail_lengths) + tail_slots % max(T, 1)
    key_gather = torch.cat((prefix_gather.view(G, P).index_select(0, owner), tail_gather.view(R, T)), dim=1).flatten()
    tail_visible = None
    if P:
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        past = (torch.arange(P, device=device) < own_prefix[:, None])[:, None, None, :]
        tail_visible = torch.cat((past.expand(R, 1, T, P), causal.expand(R, 1, T, T)), dim=-1)
    positions = torch.cat((prefix_slots % max(P, 1), tail_positions))
    query_gather, query_slots, query_visible = _scored_queries(tail_gather, (R, T), at_rows, at_cols, past if P else None)
    return Layout(
        ids=torch.cat((prefix.flatten()[prefix_slots], rows[:, :T].flatten()[tail_slots])),
        positions=positions,
        span=int(positions.max().item()) + 1 if positions.numel() else 1,
        n_prefix=n_prefix,
        prefix_slots=prefix_slots,
        tail_slots=tail_slots,
        prefix_gather=prefix_gather,
        tail_gather=tail_gather,
        key_gather=key_gather,
        prefix_shape=(G, P),
        tail_shape=(R, T),
        tail_visible=tail_visible,
        scored=tail_gather[at_rows * T + at_cols] - n_prefix,
        query_gather=query_gather,
        query_slots=query_slots,
        query_visible=query_visible,
    )


def _scored_queries(
    tail_gather: Tensor, tail_shape: tuple[int, int], at_rows: Tensor, at_cols: Tensor, past: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """(query_gather, query_slots, query_visible) of the scored positions (see ``Layout``);
    ``past`` [R, 1, 1, Pmax]: which prefix key slots each row sees (None: no prefix)."""
    R, T = tail_shape
    device = at_rows.device
    counts = torch.bincount(at_rows, minlength=R)
    Q = int(counts.max().item()) if at_rows.numel() else 0
    order = torch.sort(at_rows, stable=True).indices
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=device) - starts[at_rows[order]]
    query_slots = at_rows * Q + rank
    columns = torch.zeros(R * Q, dtype=torch.long, device=device)  # padding: column 0, whose key every row has
    columns[query_slots] = at_cols
    query_gather = tail_gather[(torch.arange(R * Q, device=device) // max(Q, 1)) * T + columns]
    own = (torch.arange(T, device=device) <= columns.view(R, Q, 1))[:, None]  # [R, 1, Q, T]: causal in the tail
    visible = own if past is None else torch.cat((past.expand(R, 1, Q, past.size(-1)), own), dim=-1)
    return query_gather, query_slots, visible


def _padded(flat: Tensor, gather: Tensor, rows: int) -> Tensor:
    """[N, heads, D] flat tokens as [rows, heads, L, D], slot by slot from ``gather``."""
    return flat.index_select(0, gather).view(rows, -1, *flat.shape[1:]).transpose(1, 2)


def _flat(padded: Tensor, slots: Tensor) -> Tensor:
    """[B, heads, L, D] back to [n, heads * D] at the slots."""
    B, H, L, D = padded.shape
    return padded.transpose(1, 2).reshape(B * L, H * D).index_select(0, slots)


def _expand_kv(k: Tensor, n_rep: int) -> Tensor:
    return k.repeat_interleave(n_rep, dim=1) if n_rep > 1 else k


def _heads(attn: Any, x: Tensor, ve: Tensor | None, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q [N, H, D] and k, v [N, Hkv, D] of flat tokens: ``CausalSelfAttention.heads`` over
    them as one sequence of N (``cos``/``sin`` [1, 1, N, D/2], each token's own angles)."""
    q, k, v = attn.heads(x[None], None if ve is None else ve[None], cos, sin)
    return q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1)


def _scored_attention(q: Tensor, k: Tensor, v: Tensor, at: Layout) -> Tensor:
    """Attention outputs [M, H * D] at the scored positions only, in their order."""
    R = at.tail_shape[0]
    n_rep = q.size(1) // k.size(1)
    keys_from = at.key_gather if at.tail_visible is not None else at.tail_gather
    keys, values = _expand_kv(_padded(k, keys_from, R), n_rep), _expand_kv(_padded(v, keys_from, R), n_rep)
    out = F.scaled_dot_product_attention(_padded(q, at.query_gather, R), keys, values, attn_mask=at.query_visible)
    return _flat(out, at.query_slots)


def _attention(q: Tensor, k: Tensor, v: Tensor, at: Layout) -> tuple[Tensor | None, Tensor]:
    """(prefix outputs [Np, H * D] or None, tail outputs [Nt, H * D]) of flat q, k, v."""
    (G, _), (R, _) = at.prefix_shape, at.tail_shape
    n_rep = q.size(1) // k.size(1)
    tq = _padded(q, at.tail_gather, R)
    if at.tail_visible is None:
        tail = ops.causal_attention(tq, _padded(k, at.tail_gather, R), _padded(v, at.tail_gather, R))
    else:
        keys, values = _expand_kv(_padded(k, at.key_gather, R), n_rep), _expand_kv(_padded(v, at.key_gather, R), n_rep)
        tail = F.scaled_dot_product_attention(tq, keys, values, attn_mask=at.tail_visible)
    prefix = None
    if at.n_prefix:
        pq, pk, pv = (_padded(t, at.prefix_gather, G) for t in (q, k, v))
        prefix = _flat(ops.causal_attention(pq, pk, pv), at.prefix_slots)
    return prefix, _flat(tail, at.tail_slots)


@torch.no_grad()
def hidden_ragged(
    model: Any, prefix: Tensor, prefix_lengths: Tensor, rows: Tensor, owner: Tensor, at_rows: Tensor, at_cols: Tensor
) -> Tensor:
    """The normed last hidden states [M, n_embd] (the head's input) of the sequences
    ``prefix[owner[r], :prefix_lengths[owner[r]]] + rows[r]`` at tail positions
    ``(at_rows[i], at_cols[i])``: ``model.head`` of them is what ``model.forward`` gives at
    full position ``prefix_lengths[owner[r]] + at_cols[i]``."""
    # Built on the host: its nonzero() and sizes would each wait for an accelerator.
    host = (t.cpu() for t in (prefix, prefix_lengths, rows, owner, at_rows, at_cols))
    at = layout(*host).to(rows.device)
    cos, sin = model._rotary(at.span, rows.device)
    cos, sin = cos[:, :, at.positions], sin[:, :, at.positions]
    x = ops.rms_norm(model.wte(at.ids))
    n, last = at.n_prefix, len(model.blocks) - 1
    for i, block in enumerate(model.blocks):
        q, k, v = _heads(block.attn, ops.rms_norm(x), model._value_embed(i, at.ids), cos, sin)
        if i == last:  # only the scored positions go on
            x = x[n:].index_select(0, at.scored) + ops.linear(_scored_attention(q, k, v, at), block.attn.c_proj.weight)
        else:
            prefix_out, tail_out = _attention(q, k, v, at)
            y = tail_out if prefix_out is None else torch.cat((prefix_out, tail_out))
            x = x + ops.linear(y, block.attn.c_proj.weight)
        x = x + block.mlp(ops.rms_norm(x))
    return ops.rms_norm(x)
