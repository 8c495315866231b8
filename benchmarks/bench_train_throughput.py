"""Training throughput on CPU: trnf's GPT + Muon/AdamW versus a plain PyTorch GPT + AdamW.

Both models have the same shape (depth, width, heads, KV heads, vocabulary, context,
batch) and the same architecture family (untied head, parameter-free RMSNorm, rotary,
GQA, ReLU^2); the reference is written the straightforward way in this file and trained
with one AdamW over every parameter. A step is forward + backward + optimizer step on
fixed random tokens. The two are measured in the same process, alternating in rounds, so
that machine noise hits both; the result is the ratio of median tokens/s (> 1: trnf is
faster). Prints one JSON object.

    .venv/bin/python benchmarks/bench_train_throughput.py [--rounds 5] [--steps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trnfrontier.runtime.model import GPT, GPTConfig  # noqa: E402
from trnfrontier.runtime.optim import apply_schedule, build_optimizers  # noqa: E402
from trnfrontier.runtime.recipe import OptimSpec  # noqa: E402

# recipes/cpu_smoke.yaml's model and batch, and a depth-4 model of the same family.
SHAPES = {
    "cpu_smoke": dict(depth=2, n_embd=128, head_dim=32, n_kv_head=2, seq=256, batch=16, vocab=8192),
    "depth4": dict(depth=4, n_embd=256, head_dim=64, n_kv_head=2, seq=256, batch=8, vocab=8192),
}
# The optim section a resolved recipe carries by default.
OPTIM = OptimSpec()


# ---------------------------------------------------------------- the plain reference


class RefAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_kv_head: int) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv_head, n_embd // n_head
        self.q = nn.Linear(n_embd, n_embd, bias=False)
        self.k = nn.Linear(n_embd, n_kv_head * self.head_dim, bias=False)
        self.v = nn.Linear(n_embd, n_kv_head * self.head_dim, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q = F.rms_norm(self.rotate(q, cos, sin), (self.head_dim,))
        k = F.rms_norm(self.rotate(k, cos, sin), (self.head_dim,))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class RefBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_kv_head: int) -> None:
        super().__init__()
        self.attn = RefAttention(n_embd, n_head, n_kv_head)
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.out = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(F.rms_norm(x, (x.size(-1),)), cos, sin)
        return x + self.out(F.relu(self.fc(F.rms_norm(x, (x.size(-1),)))).square())


class RefGPT(nn.Module):
    def __init__(
        self, vocab: int, depth: int, n_embd: int, n_head: int, n_kv_head: int, seq: int
    ) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, n_embd)
        self.blocks = nn.ModuleList(RefBlock(n_embd, n_head, n_kv_head) for _ in range(depth))
        self.head = nn.Linear(n_embd, vocab, bias=False)
        half = n_embd // n_head // 2
        freqs = torch.outer(
            torch.arange(seq).float(), 1.0 / 10000 ** (torch.arange(half).float() / half)
        )
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        x = F.rms_norm(self.emb(idx), (self.emb.embedding_dim,))
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.head(F.rms_norm(x, (x.size(-1),))).float()
        logits = 15.0 * torch.tanh(logits / 15.0)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# ---------------------------------------------------------------- measuring


def make_trnf(shape: dict):
    config = GPTConfig(
        vocab_size=shape["vocab"],
        sequence_len=shape["seq"],
        n_layer=shape["depth"],
        n_head=shape["n_embd"] // shape["head_dim"],
        n_kv_head=shape["n_kv_head"],
        n_embd=shape["n_embd"],
    )
    model = GPT(config)
    optimizers = build_optimizers(model, OPTIM)

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        t0 = time.perf_counter()
        loss = model.loss(x, y)
        loss.backward()
        value = loss.item()
        t1 = time.perf_counter()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        apply_schedule(optimizers, 1.0, 0.95)
        return value, t1 - t0

    return model, step


def make_reference(shape: dict):
    model = RefGPT(
        shape["vocab"],
        shape["depth"],
        shape["n_embd"],
        shape["n_embd"] // shape["head_dim"],
        shape["n_kv_head"],
        shape["seq"],
    )
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.8, 0.95), weight_decay=0.0)

    def step(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()
        value = loss.item()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return value, t1 - t0

    return model, step


def timed(step, x: torch.Tensor, y: torch.Tensor, steps: int) -> tuple[float, float]:
    """(tokens/s of whole steps, tokens/s of their forward + backward alone) over
    ``steps`` steps; CPU execution is synchronous, so the split is exact."""
    model_seconds = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        loss, seconds = step(x, y)
        model_seconds += seconds
    elapsed = time.perf_counter() - start
    if not math.isfinite(loss):
        raise RuntimeError("non-finite loss during the benchmark")
    return x.numel() * steps / elapsed, x.numel() * steps / model_seconds


def bench_shape(name: str, shape: dict, rounds: int, steps: int, warmup: int) -> dict:
    torch.manual_seed(0)
    x = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]))
    y = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]))
    trnf_model, trnf_step = make_trnf(shape)
    ref_model, ref_step = make_reference(shape)
    for _ in range(warmup):
        trnf_step(x, y)
        ref_step(x, y)
    samples: dict[str, list[tuple[float, float]]] = {"trnf": [], "reference": []}
    for r in range(rounds):
        # Alternate which goes first so that neither always follows the other.
        order = [("trnf", trnf_step), ("reference", ref_step)]
        for who, step in order if r % 2 == 0 else order[::-1]:
            samples[who].append(timed(step, x, y, steps))
    trnf_tps = [s[0] for s in samples["trnf"]]
    ref_tps = [s[0] for s in samples["reference"]]
    trnf_med, ref_med = statistics.median(trnf_tps), statistics.median(ref_tps)
    trnf_fb = statistics.median(s[1] for s in samples["trnf"])
    ref_fb = statistics.median(s[1] for s in samples["reference"])
    return {
        "shape": shape,
        "params_trnf": trnf_model.num_params(),
        "params_reference": sum(p.numel() for p in ref_model.parameters()),
        "tokens_per_step": x.numel(),
        "trnf_tokens_per_second": round(trnf_med, 1),
        "reference_tokens_per_second": round(ref_med, 1),
        "ratio_trnf_over_reference": round(trnf_med / ref_med, 3),
        # Forward + backward only: the model implementations compared without the
        # optimizer choice (Muon's orthogonalisation is real extra work per step, whose
        # share shrinks as tokens per step grow).
        "forward_backward_ratio": round(trnf_fb / ref_fb, 3),
        "trnf_samples": [round(v, 1) for v in trnf_tps],
        "reference_samples": [round(v, 1) for v in ref_tps],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per timed sample")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {
        name: bench_shape(name, SHAPES[name], args.rounds, args.steps, args.warmup)
        for name in args.shapes.split(",")
    }
    print(
        json.dumps(
            {
                "benchmark": "train_throughput_cpu",
                "reference": "plain PyTorch GPT of the same shape, one AdamW (this file)",
                "step": "forward + backward + optimizer step, float32",
                "machine": {
                    "platform": platform.platform(),
                    "processor": platform.processor() or platform.machine(),
                    "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                },
                "rounds": args.rounds,
                "steps_per_sample": args.steps,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
