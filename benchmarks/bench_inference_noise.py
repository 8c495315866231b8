"""How far apart next-token distributions drift for reasons that are and are not "the same
model": the measurement behind verify's inference tolerance (TV_TOLERANCE, 0.02).

    .venv/bin/python benchmarks/bench_inference_noise.py [--steps 60] [--seed 0]

Trains a small GPT (depth 4, width 128, vocabulary 512) for ``--steps`` steps on a learnable
pattern, then compares its float32 next-token distributions on random token rows (what
verify probes with) against: the same rows scored one at a time, through the shared-prefix
path (``logits_after_prefix``), under bfloat16 autocast, with weights 0.1% off, and after
one more optimizer step. Prints one JSON document: for each, the largest total variation
distance (half the L1 distance between the distributions) over positions, the largest
|delta log p| and the mean KL. The reference is the float32 forward measured in the same run.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform

import torch

from trnfrontier.runtime.model import GPT, GPTConfig
from trnfrontier.runtime.optim import build_optimizers
from trnfrontier.runtime.recipe import OptimSpec
from trnfrontier.verify.inference_check import TV_TOLERANCE, total_variation


def _trained(steps: int, seed: int) -> tuple[GPT, GPT]:
    """The model after ``steps`` steps, and a copy one step further."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=512, sequence_len=64, n_layer=4, n_head=4, n_kv_head=2, n_embd=128, value_embeds=True))
    data = torch.randint(0, 512, (64, 65))
    data[:, 1::2] = (data[:, 0::2][:, :32] * 7 + 3) % 512  # every other token follows from the one before

    def step(m: GPT, optimizers: list[torch.optim.Optimizer]) -> None:
        x = data[torch.randint(0, 64, (16,))]
        m.loss(x[:, :-1], x[:, 1:]).backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)

    optimizers = build_optimizers(model, OptimSpec())
    for _ in range(steps):
        step(model, optimizers)
    later = copy.deepcopy(model)
    step(later, build_optimizers(later, OptimSpec()))
    return model.eval(), later.eval()


@torch.no_grad()
def _logprobs(model: GPT, tokens: torch.Tensor, bf16: bool = False) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return torch.log_softmax(model(tokens).float(), dim=-1)


def _row(reference: torch.Tensor, other: torch.Tensor) -> dict[str, float]:
    p = reference.exp()
    return {"max_tv": total_variation(reference, other), "max_abs_dlogp": float((other - reference).abs().max()),
            "mean_kl": float((p * (reference - other)).sum(-1).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, later = _trained(args.steps, args.seed)
    torch.set_grad_enabled(False)
    tokens = torch.randint(0, 512, (4, 64), generator=torch.Generator().manual_seed(args.seed + 1))
    reference = _logprobs(model, tokens)
    prefix, owner = tokens[:1, :20], torch.zeros(4, dtype=torch.long)
    rows = torch.cat((prefix.expand(4, -1), tokens[:, 20:]), dim=1)
    positions = torch.arange(44).repeat(4)
    shared = model.logits_after_prefix(prefix, tokens[:, 20:], owner, torch.arange(4).repeat_interleave(44), positions)
    noisy = copy.deepcopy(model)
    for p in noisy.parameters():
        p.mul_(1 + 1e-3 * torch.randn_like(p))
    doc = {
        "benchmark": "bench_inference_noise",
        "machine": platform.platform(),
        "torch": torch.__version__,
        "tolerance": TV_TOLERANCE,
        "same model": {
            "rows one at a time": _row(reference, torch.cat([_logprobs(model, tokens[i : i + 1]) for i in range(4)])),
            "shared-prefix path": _row(_logprobs(model, rows)[:, 20:], torch.log_softmax(shared.float(), -1).view(4, 44, -1)),
            "bfloat16 autocast": _row(reference, _logprobs(model, tokens, bf16=True)),
        },
        "not the same model": {
            "weights 0.1% off": _row(reference, _logprobs(noisy, tokens)),
            "one more optimizer step": _row(reference, _logprobs(later, tokens)),
        },
    }
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
