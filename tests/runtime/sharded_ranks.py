"""One gloo rank of tests/runtime/test_sharded_optim.py: the sharded optimizer against the
replicated one on the same gradients, step by step, then a checkpoint and a resume.

    python sharded_ranks.py GRADS CLIP CHECKPOINT_FILE

GRADS ``random``: each rank's gradients are random floats (their average is the same bits
in any summation order only with two ranks); ``dyadic``: multiples of 2^-12 below 2^-2,
whose sums are exact in any order, so the averaged gradient is the same bits at any
world size and any difference would be the optimizer's. CLIP: the grad-norm clip (0 off).
Exit 0 when every check holds; an AssertionError names the first that did not.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist

from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.optim import apply_schedule, build_optimizers, clip_grad_norm
from trnfrontier.runtime.recipe import OptimSpec
from trnfrontier.runtime.sharded_optim import ShardedUpdate

OPTIM = OptimSpec(matrix_lr=0.02, weight_decay=0.1, cautious_weight_decay=True, normuon=True, muon_momentum=0.95)
STEPS, RESUMED_STEPS = 4, 3


def tiny_model() -> GPT:
    """Three layers (buckets of 3 and 6 matrices: uneven over 2 and 4 ranks), value
    embeddings (more AdamW tensors), a 256-token vocabulary (sliced by rows)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=256, sequence_len=16, n_layer=3, n_head=2, n_kv_head=1, n_embd=64, value_embeds=True)
    return GPT(cfg)


def gradients(model: GPT, step: int, rank: int, kind: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    out = []
    for p in model.parameters():
        if kind == "dyadic":
            out.append(torch.randint(-1024, 1024, p.shape, generator=gen).float() * 2.0**-12)
        else:
            out.append(torch.randn(p.shape, generator=gen) * 0.01)
    return out


def replicated_step(model: GPT, opts: list, grads: list[torch.Tensor], world: int, clip: float) -> None:
    """What DDP + the optimizers' step() do: average (x 1/world, then sum), clip, step."""
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g.mul(1.0 / world)
        dist.all_reduce(p.grad)
    clip_grad_norm(model.parameters(), clip)
    for opt in opts:
        opt.step()
        opt.zero_grad(set_to_none=True)


def sharded_step(model: GPT, update: ShardedUpdate, grads: list[torch.Tensor], clip: float) -> None:
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g.clone()
    update.step(clip)
    for opt in update.optimizers:
        opt.zero_grad(set_to_none=True)


def same(a: GPT, b: GPT, exact: bool) -> None:
    for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True):
        if exact:
            assert torch.equal(x, y), f"{name} differs by {(x - y).abs().max().item():.3g}"
        else:
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


def same_state(ours: list[dict], theirs: list[dict]) -> None:
    for sd, ref in zip(ours, theirs, strict=True):
        assert sorted(sd["state"]) == sorted(ref["state"]), "different parameters hold state"
        for idx, entry in ref["state"].items():
            for key, value in entry.items():
                assert torch.equal(sd["state"][idx][key], value), f"state {idx}.{key} differs"


def main() -> None:
    kind, clip, ckpt_file = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    exact = clip <= 0
    reference, model = tiny_model(), tiny_model()
    ref_opts = build_optimizers(reference, OPTIM, batch_tokens=None)
    update = ShardedUpdate(build_optimizers(model, OPTIM, batch_tokens=None))

    # Each rank keeps momentum for its own matrices only.
    muon_state = len(update.optimizers[-1].state)
    counts = [None] * world
    dist.all_gather_object(counts, muon_state)
    assert sum(counts) == sum(len(b.params) for b in update.buckets), counts

    def both(step: int, ups: list[ShardedUpdate], models: list[GPT]) -> None:
        lrm, momentum = 1.0 - 0.1 * step, 0.85 + 0.02 * step  # a moving schedule
        apply_schedule(ref_opts, lrm, momentum)
        grads = gradients(reference, step, rank, kind)
        replicated_step(reference, ref_opts, grads, world, clip)
        for up, m in zip(ups, models, strict=True):
            apply_schedule(up.optimizers, lrm, momentum)
            sharded_step(m, up, grads, clip)
            same(reference, m, exact)

    for step in range(STEPS):
        both(step, [update], [model])

    saved = update.state_dicts()
    if rank == 0:
        assert saved is not None
        if exact:
            same_state(saved, [opt.state_dict() for opt in ref_opts])
        torch.save({"optimizers": saved}, ckpt_file)
    else:
        assert saved is None
    dist.barrier()

    # A resume: fresh optimizers load the replicated-layout file, then shard it again.
    resumed_model = copy.deepcopy(model)
    fresh = build_optimizers(resumed_model, OPTIM, batch_tokens=None)
    for opt, sd in zip(fresh, torch.load(ckpt_file, weights_only=True)["optimizers"], strict=True):
        opt.load_state_dict(sd)
    resumed = ShardedUpdate(fresh)
    for step in range(STEPS, STEPS + RESUMED_STEPS):
        both(step, [update, resumed], [model, resumed_model])
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {STEPS + RESUMED_STEPS} steps, {'bit for bit' if exact else 'within tolerance'}")


if __name__ == "__main__":
    main()
