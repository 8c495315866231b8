"""Data-parallel optimizer work split across ranks, bit for bit the replicated update.

Under plain DDP every rank all-reduces every gradient and then runs the whole optimizer:
on a Trainium2 chip at LNC 2 that is four copies of every Muon orthogonalisation, on a
16-chip server 64 or 128. ``ShardedUpdate`` takes the optimizers ``optim.build_optimizers``
made (``AdamW`` and ``Muon``, with their param groups, schedule tensors and compiled
``update_fn``) and replaces DDP's all-reduce and their ``step()`` with:

1. reduce: each gradient multiplied by 1/world (as DDP does before it sums), then summed
   so that each rank receives only its share: every bucket of same-shaped Muon matrices
   is stacked, zero-padded to a whole number of matrices per rank and reduce-scattered
   (rank r owns matrices ``[r*chunk, (r+1)*chunk)``; the ranks that own only padding share
   one zero chunk, so padding a bucket to 128 ranks costs one chunk); an AdamW tensor of at least
   ``SLICE_MIN_NUMEL`` elements whose first dimension divides by the world size is
   reduce-scattered by rows; the remaining small AdamW tensors are all-reduced in one
   flat buffer and stepped on every rank (they are a few thousand numbers);
2. optional gradient clipping: the global norm from each rank's share (see below);
3. update: each rank runs the optimizers' own update functions (``muon.muon_update``,
   ``optim.adamw_update``, compiled when the run compiles) on its share only, and keeps
   optimizer state only for its share (momentum buffers of its matrices, AdamW moments of
   its rows);
4. gather: the updated matrices and rows are all-gathered, so every rank again holds the
   whole model (a checkpoint or ``load_for_eval`` never sees a shard).

Same update, same bits: Muon treats each matrix on its own and AdamW each element on its
own, so an owner computes exactly what every rank computed before. Two things make that
hold: ``muon.polar_express`` normalises in float32, so a matrix's bits do not depend on how
many matrices share the call; and the gradient is averaged the way DDP averages it. With
two ranks the average is the same bits as DDP's (a + b is commutative); with more, the
collective may sum an element's contributions in another order than DDP's bucket did (gloo
orders each element's sum by its position in the flat buffer), a difference of rounding in
the gradient, not in the optimizer. Gradient clipping under sharding sums the squared
norm from the shards, in another order than ``torch.nn.utils.clip_grad_norm_``: the same
value up to rounding, so ``optim.sharded: auto`` turns sharding on only when clipping is
off (``sharding_is_exact``).

Checkpoints keep the replicated layout: ``state_dicts()`` gathers every rank's share to
rank 0, which writes the same ``optim.pt`` a replicated run writes, and a
``ShardedUpdate`` built over optimizers that hold full state (a resumed run) keeps only its
share. So a checkpoint resumes in either mode; the data-loader state still ties a resume
to the world size that wrote it (the trainer says so in one line).

Runtime layer: standard library and torch only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from trnfrontier.runtime.muon import Muon
from trnfrontier.runtime.optim import AdamW

# Below this many elements an AdamW tensor is all-reduced and stepped on every rank:
# slicing a handful of scalars costs more in collectives than it saves (nanochat: 1024).
SLICE_MIN_NUMEL = 1024
ADAM_STATE = ("exp_avg", "exp_avg_sq")
# torch 2.13 renamed the two tensor collectives; the organisers' torch (2.11) has only the old names.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
MUON_STATE = ("momentum_buffer", "second_moment")


def sharding_is_exact(world_size: int, grad_clip: float) -> bool:
    """Whether sharding gives the replicated update's bits, i.e. what ``optim.sharded: auto``
    turns on: several ranks and no gradient clipping (see the module docstring)."""
    return world_size > 1 and grad_clip <= 0


def resolve_sharded(setting: bool | str, world_size: int, grad_clip: float) -> bool:
    """The decision for a recipe's ``optim.sharded`` (true, false or "auto"). One rank
    never shards: there is nothing to split."""
    if setting not in (True, False, "auto"):
        raise ValueError(f"optim.sharded={setting!r}: expected true, false or auto")
    if world_size <= 1 or setting is False:
        return False
    return setting is True or sharding_is_exact(world_size, grad_clip)


@dataclass
class _Bucket:
    """The same-shaped matrices of one Muon group, and the ones this rank owns."""

    opt: Muon
    group: dict[str, Any]
    params: list[Tensor]
    chunk: int  # matrices per rank, padding included
    start: int  # this rank's first matrix

    @property
    def owned(self) -> list[Tensor]:
        return self.params[self.start : self.start + self.chunk]


@dataclass
class _Slice:
    """An AdamW tensor: this rank's rows (``rows``) or the whole tensor on every rank (None)."""

    param: Tensor
    rows: slice | None

    def view(self) -> Tensor:
        return self.param if self.rows is None else self.param[self.rows]


@dataclass
class _Pending:
    """Collectives of one step in flight, and the tensors they fill."""

    works: list[Any] = field(default_factory=list)
    muon_grads: list[Tensor] = field(default_factory=list)  # per bucket: [chunk, *shape]
    # per bucket: one [chunk, *shape] tensor per rank (the reduce's input, then the gather's
    # output); a rank that owns only padding shares one zero tensor (see _rank_chunks)
    muon_stacks: list[list[Tensor]] = field(default_factory=list)
    adam_grads: dict[int, Tensor] = field(default_factory=dict)  # id(param) -> reduced share

    def wait(self) -> None:
        for work in self.works:
            work.wait()
        self.works.clear()


class ShardedUpdate:
    """One data-parallel optimizer step with the work split across ranks (module docstring).

    ``optimizers``: the list ``build_optimizers`` returned (AdamW and/or Muon). They keep
    their param groups (the schedule moves their LRs as before) and their ``update_fn``;
    their ``step()`` is no longer called. Every rank must construct this with the same
    model and optimizers, after any ``load_state_dict`` (a resume): state the optimizers
    hold is cut down to this rank's share here. Rank 0's parameters are broadcast first,
    as DDP does, so every rank starts from the same weights.
    """

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.buckets: list[_Bucket] = []
        self.slices: list[tuple[AdamW, dict[str, Any], list[_Slice]]] = []
        for opt in self.optimizers:
            if isinstance(opt, Muon):
                self._plan_muon(opt)
            elif isinstance(opt, AdamW):
                self._plan_adamw(opt)
            else:
                raise TypeError(f"ShardedUpdate shards Muon and AdamW, not {type(opt).__name__}")
        for p in self._all_params():
            dist.broadcast(p.data, src=0)
        self._adopt_state()

    # ------------------------------------------------------------------ the plan

    def _plan_muon(self, opt: Muon) -> None:
        for group in opt.param_groups:
            shapes: dict[tuple[int, ...], list[Tensor]] = defaultdict(list)
            for p in group["params"]:
                shapes[tuple(p.shape)].append(p)
            for params in shapes.values():
                chunk = -(-len(params) // self.world)
                self.buckets.append(_Bucket(opt, group, params, chunk, self.rank * chunk))

    def _plan_adamw(self, opt: AdamW) -> None:
        for group in opt.param_groups:
            pieces = []
            for p in group["params"]:
                rows = None
                if p.numel() >= SLICE_MIN_NUMEL and p.dim() >= 1 and p.shape[0] % self.world == 0:
                    n = p.shape[0] // self.world
                    rows = slice(self.rank * n, (self.rank + 1) * n)
                pieces.append(_Slice(p, rows))
            self.slices.append((opt, group, pieces))

    def _all_params(self) -> Iterator[Tensor]:
        for bucket in self.buckets:
            yield from bucket.params
        for _, _, pieces in self.slices:
            yield from (piece.param for piece in pieces)

    def _adopt_state(self) -> None:
        """Keep only this rank's share of whatever state the optimizers hold (full state
        after a resume or a fresh Muon's zero buffers)."""
        for bucket in self.buckets:
            owned = {id(p) for p in bucket.owned}
            for p in bucket.params:
                if id(p) not in owned:
                    bucket.opt.state.pop(p, None)
        for opt, _, pieces in self.slices:
            for piece in pieces:
                state = opt.state.get(piece.param)
                if state and piece.rows is not None and state["exp_avg"].shape == piece.param.shape:
                    for key in ADAM_STATE:
                        state[key] = state[key][piece.rows].clone()

    # ------------------------------------------------------------------ the step

    @torch.no_grad()
    def step(self, grad_clip: float = 0.0) -> None:
        """Reduce, (clip), update this rank's share, gather. Every parameter the optimizers
        hold must have a gradient (as under DDP, where an unused one is an error too)."""
        pending = self._reduce()
        pending.wait()
        if grad_clip > 0:
            self._clip(pending, grad_clip)
        gathers: list[Any] = []
        for opt, group, pieces in self.slices:
            self._update_adamw(opt, group, pieces, pending, gathers)
        for i, bucket in enumerate(self.buckets):
            self._update_muon(bucket, pending.muon_grads[i], pending.muon_stacks[i], gathers)
        for work, finish in gathers:
            work.wait()
            finish()

    def _grad(self, p: Tensor) -> Tensor:
        if p.grad is None:
            raise RuntimeError(
                f"a parameter of shape {tuple(p.shape)} has no gradient: the sharded optimizer "
                "needs every parameter used in the step (set optim.sharded=off to skip unused ones)"
            )
        return p.grad

    def _reduce(self) -> _Pending:
        pending, scale = _Pending(), 1.0 / self.world
        small: list[Tensor] = []
        for _, _, pieces in self.slices:
            for piece in pieces:
                if piece.rows is None:
                    small.append(piece.param)
                    continue
                grad = self._grad(piece.param).mul(scale)
                out = torch.empty_like(grad[piece.rows])
                pending.works.append(_reduce_scatter(out, grad, async_op=True))
                pending.adam_grads[id(piece.param)] = out
        if small:
            flat = torch.cat([self._grad(p).reshape(-1) for p in small]).mul_(scale)
            pending.works.append(dist.all_reduce(flat, async_op=True))
            for p, part in zip(small, flat.split([p.numel() for p in small]), strict=True):
                pending.adam_grads[id(p)] = part.view_as(p)
        for bucket in self.buckets:
            chunks = self._rank_chunks(bucket, [self._grad(p) for p in bucket.params])
            for chunk in {id(c): c for c in chunks}.values():
                chunk.mul_(scale)
            out = bucket.params[0].new_empty((bucket.chunk, *bucket.params[0].shape))
            pending.works.append(dist.reduce_scatter(out, chunks, async_op=True))
            pending.muon_grads.append(out)
            pending.muon_stacks.append(chunks)
        return pending

    def _rank_chunks(self, bucket: _Bucket, tensors: list[Tensor]) -> list[Tensor]:
        """``tensors`` (one per matrix of ``bucket``) as one [chunk, *shape] tensor per rank,
        zero-padded. The list form of the collectives: the tensor form needs chunk*world
        matrices in one allocation, most of it padding when a bucket has fewer matrices than
        there are ranks (22 matrices on 128 ranks: 106 zero matrices), while here every rank
        that owns nothing shares one zero tensor. Same sums as the stacked tensor form."""
        first = bucket.params[0]
        shared_zero: Tensor | None = None
        chunks: list[Tensor] = []
        for rank in range(self.world):
            mine = tensors[rank * bucket.chunk : (rank + 1) * bucket.chunk]
            if not mine:
                shared_zero = first.new_zeros((bucket.chunk, *first.shape)) if shared_zero is None else shared_zero
                chunks.append(shared_zero)
                continue
            chunk = first.new_zeros((bucket.chunk, *first.shape))
            torch.stack(mine, out=chunk[: len(mine)])
            chunks.append(chunk)
        return chunks

    def _clip(self, pending: _Pending, max_norm: float) -> None:
        """Scale every share by ``max_norm / (norm + 1e-6)`` (at most 1), the rule of
        ``clip_grad_norm_``, with the norm summed from the shards: each rank counts what it
        owns, and rank 0 alone the tensors every rank holds whole."""
        owned: list[Tensor] = []
        for bucket, grads in zip(self.buckets, pending.muon_grads, strict=True):
            owned.extend(grads[: len(bucket.owned)])
        counted = list(owned)
        for _, _, pieces in self.slices:
            for piece in pieces:
                grad = pending.adam_grads[id(piece.param)]
                owned.append(grad)
                if piece.rows is not None or self.rank == 0:
                    counted.append(grad)
        sq = torch.zeros((), dtype=torch.float32, device=owned[0].device)
        for g in counted:
            sq += g.float().square().sum()
        dist.all_reduce(sq)
        coef = torch.clamp(max_norm / (sq.sqrt() + 1e-6), max=1.0)
        for g in owned:
            g.mul_(coef.to(g.dtype))

    def _update_adamw(
        self, opt: AdamW, group: dict[str, Any], pieces: list[_Slice], pending: _Pending, gathers: list[Any]
    ) -> None:
        """The group's update on this rank's rows (as ``AdamW.step`` does on whole tensors),
        then the rows all-gathered back into each parameter."""
        if not pieces:
            return
        views = [piece.view() for piece in pieces]
        states = [self._adam_state(opt, piece.param, view) for piece, view in zip(pieces, views, strict=True)]
        opt.update_group(group, views, [pending.adam_grads[id(piece.param)] for piece in pieces], states)
        for piece, view in zip(pieces, views, strict=True):
            if piece.rows is not None:
                # A copy of the rows as the input: the output is the parameter itself.
                work = _all_gather(piece.param, view.clone(), async_op=True)
                gathers.append((work, _nothing))

    @staticmethod
    def _adam_state(opt: AdamW, p: Tensor, view: Tensor) -> dict[str, Tensor]:
        state = opt.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            for key in ADAM_STATE:
                state[key] = torch.zeros_like(view, memory_format=torch.preserve_format)
        return state

    def _update_muon(self, bucket: _Bucket, grads: Tensor, chunks: list[Tensor], gathers: list[Any]) -> None:
        """Muon on this rank's matrices of the bucket (``Muon._step_group``'s call), then
        every rank's matrices all-gathered into ``chunks`` (the reduce's inputs, done with)
        and copied into the others. A shared zero chunk receives only zeros: the ranks it
        stands for own nothing and send zeros."""
        owned, group, opt = bucket.owned, bucket.group, bucket.opt
        if owned:
            states = [opt._init_state(p, group) for p in owned]
            opt.update_bucket(group, owned, list(grads[: len(owned)].unbind(0)), states)
        mine = torch.zeros_like(grads)
        if owned:
            torch.stack(owned, out=mine[: len(owned)])
        work = dist.all_gather(chunks, mine, async_op=True)

        def copy_back() -> None:
            mine_ids = {id(p) for p in owned}
            gathered = (new for chunk in chunks for new in chunk.unbind(0))
            for p, new in zip(bucket.params, gathered, strict=False):
                if id(p) not in mine_ids:
                    p.copy_(new)

        gathers.append((work, copy_back))

    # ------------------------------------------------------------------ checkpoints

    @torch.no_grad()
    def state_dicts(self) -> list[dict[str, Any]] | None:
        """Collective: each optimizer's ``state_dict()`` in the replicated layout on rank 0
        (every rank's share gathered there), None on the other ranks."""
        full: dict[int, dict[str, Any]] = {}
        for bucket in self.buckets:
            self._gather_muon_state(bucket, full)
        for opt, _, pieces in self.slices:
            for piece in pieces:
                self._gather_adam_state(opt, piece, full)
        if self.rank != 0:
            return None
        out = []
        for opt in self.optimizers:
            sd = opt.state_dict()
            order = [p for group in opt.param_groups for p in group["params"]]
            sd["state"] = {i: full[id(p)] for i, p in enumerate(order) if id(p) in full}
            out.append(sd)
        return out

    def _gather_to_root(self, mine: Tensor) -> Tensor | None:
        """Every rank's equally shaped ``mine`` concatenated along dim 0, on rank 0."""
        parts = [torch.empty_like(mine) for _ in range(self.world)] if self.rank == 0 else None
        dist.gather(mine.contiguous(), parts, dst=0)
        return torch.cat(parts) if parts is not None else None

    def _gather_muon_state(self, bucket: _Bucket, full: dict[int, dict[str, Any]]) -> None:
        keys = MUON_STATE if bucket.group["normuon"] else MUON_STATE[:1]
        owned = bucket.owned
        for key in keys:
            like = bucket.opt.state[owned[0]][key] if owned else None
            shape = like.shape if like is not None else self._muon_state_shape(bucket, key)
            first = bucket.params[0]
            mine = first.new_zeros((bucket.chunk, *shape), dtype=torch.float32 if key == "second_moment" else first.dtype)
            for i, p in enumerate(owned):
                mine[i].copy_(bucket.opt.state[p][key])
            stacked = self._gather_to_root(mine)
            if stacked is not None:
                for p, value in zip(bucket.params, stacked.unbind(0), strict=False):
                    full.setdefault(id(p), {})[key] = value.clone()

    @staticmethod
    def _muon_state_shape(bucket: _Bucket, key: str) -> tuple[int, ...]:
        first = bucket.params[0]
        return tuple(first.shape) if key == "momentum_buffer" else (first.shape[0], 1)

    def _gather_adam_state(self, opt: AdamW, piece: _Slice, full: dict[int, dict[str, Any]]) -> None:
        state = opt.state.get(piece.param)
        if not state:
            return  # no step taken yet: no rank has state for it
        entry: dict[str, Any] = {"step": state["step"].clone()}
        for key in ADAM_STATE:
            value = state[key] if piece.rows is None else self._gather_to_root(state[key])
            if value is not None:
                entry[key] = value.clone()
        if self.rank == 0:
            full[id(piece.param)] = entry


def _nothing() -> None:
    """Nothing to do after an AdamW gather: the parameter was the gather's output."""

