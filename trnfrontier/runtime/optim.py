"""The optimizers of a run: Muon for the blocks' matrices, AdamW for the rest.

``build_optimizers(model, recipe.optim)`` returns the list the trainer steps every
iteration; ``apply_schedule`` moves every group's LR (and Muon's momentum) for the next
step. Each param group remembers its base LR as ``group["initial_lr"]`` and its role as
``group["name"]`` (``matrix``, ``embedding``, ``unembedding``, ``scalar``) for logs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from trnfrontier.runtime.model import GPT
from trnfrontier.runtime.muon import Muon, set_group_value, set_hyperparams
from trnfrontier.runtime.recipe import OptimSpec

# nanochat tuned its AdamW LRs at width 768; wider models take proportionally smaller steps.
REFERENCE_WIDTH = 768


def adamw_lr_scale(n_embd: int, enabled: bool) -> float:
    return (n_embd / REFERENCE_WIDTH) ** -0.5 if enabled else 1.0


def batch_lr_scale(batch_tokens: int | None, optim: OptimSpec) -> float:
    """nanochat's batch rule: sqrt(tokens per step / reference_batch_tokens) for every LR,
    when ``lr_batch_scaling`` is on and the step's tokens are known (1 otherwise)."""
    if not batch_tokens or not optim.lr_batch_scaling:
        return 1.0
    return math.sqrt(batch_tokens / optim.reference_batch_tokens)


def build_optimizers(model: GPT, optim: OptimSpec, batch_tokens: int | None = None) -> list[torch.optim.Optimizer]:
    """[AdamW (embedding, unembedding, scalar groups), Muon (matrix group)].

    ``optim`` is the resolved recipe's ``optim`` section; ``batch_tokens`` the tokens of
    one optimizer step over all ranks, for ``batch_lr_scale``. Muon starts at
    ``muon_momentum_warmup_start`` when a momentum warm-up is configured; the trainer
    moves it every step with ``apply_schedule``. Empty groups are left out.
    """
    groups = model.param_groups()
    batch_scale = batch_lr_scale(batch_tokens, optim)
    scale = batch_scale * adamw_lr_scale(model.config.n_embd, optim.lr_width_scaling)
    adam_lrs = {
        "embedding": optim.embedding_lr * scale,
        "unembedding": optim.unembedding_lr * scale,
        "scalar": optim.scalar_lr * scale,
    }
    adam_groups = [
        {"params": groups[name], "lr": lr, "initial_lr": lr, "name": name}
        for name, lr in adam_lrs.items()
        if groups[name]
    ]
    optimizers: list[torch.optim.Optimizer] = []
    if adam_groups:
        optimizers.append(AdamW(adam_groups, betas=optim.adam_betas, eps=optim.adam_eps, weight_decay=0.0))
    if groups["matrix"]:
        matrix_lr = optim.matrix_lr * batch_scale
        warming = optim.muon_momentum_warmup_steps > 0
        muon = Muon(
            [{"params": groups["matrix"], "name": "matrix"}],
            lr=matrix_lr,
            momentum=optim.muon_momentum_warmup_start if warming else optim.muon_momentum,
            weight_decay=optim.weight_decay,
            nesterov=optim.nesterov,
            ns_steps=optim.polar_express_steps,
            normuon=optim.normuon,
            beta2=optim.normuon_beta2,
            cautious_wd=optim.cautious_weight_decay,
        )
        for group in muon.param_groups:
            group["initial_lr"] = matrix_lr
        optimizers.append(muon)
    return optimizers


def adamw_update(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    lr: Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """One AdamW step in place, as torch.optim.AdamW computes it (decoupled weight decay,
    bias-corrected moments). A pure function of its tensors, so torch.compile can compile
    it once per param group; ``lr`` is a 0-d tensor so a moving schedule never re-traces."""
    for p, g, m, v, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps, strict=True):
        step += 1
        if weight_decay:
            p.mul_(1.0 - lr * weight_decay)
        m.lerp_(g, 1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        bias1 = 1.0 - beta1**step
        bias2 = 1.0 - beta2**step
        denom = (v.sqrt() / bias2.sqrt()).add_(eps)
        p.sub_((lr / bias1) * m / denom)


class AdamW(torch.optim.AdamW):
    """torch's AdamW (same hyperparameters, same state: ``step``, ``exp_avg``,
    ``exp_avg_sq``) stepping through ``update_fn`` (``adamw_update``), which
    compiling.compile_optimizers can replace by a compiled copy."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, foreach=False, fused=False, **kwargs)
        self.update_fn: Callable[..., None] = adamw_update

    @torch.no_grad()
    def step(self, closure: Any = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            self.update_group(group, params, [p.grad for p in params], [self.state[p] for p in params])
        return loss

    def update_group(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor], states: list[dict[str, Tensor]]) -> None:
        """``update_fn`` with ``group``'s hyperparameters over ``params`` (whole tensors, or the
        row slices a sharded optimizer steps), their gradients and their state."""
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        lr_t = lr if isinstance(lr, Tensor) else torch.tensor(float(lr), device=params[0].device)
        self.update_fn(
            params,
            grads,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [s["step"] for s in states],
            lr_t,
            float(beta1),
            float(beta2),
            float(group["eps"]),
            float(group["weight_decay"]),
        )


def apply_schedule(
    optimizers: Iterable[torch.optim.Optimizer], lr_multiplier: float, muon_momentum: float
) -> None:
    """Set every group's LR to ``initial_lr * lr_multiplier`` and Muon's momentum.

    Muon's weight decay is multiplied by its LR inside the step, so it follows the
    schedule without being set here.
    """
    for opt in optimizers:
        for group in opt.param_groups:
            set_group_value(group, "lr", group["initial_lr"] * lr_multiplier)
        if isinstance(opt, Muon):
            set_hyperparams(opt, momentum=muon_momentum)


def clip_grad_norm(parameters: Iterable[Tensor], max_norm: float) -> Tensor | None:
    """Clip the global gradient norm to ``max_norm`` and return the norm before clipping
    (a tensor: reading it is the caller's choice, it syncs on accelerators). ``max_norm``
    <= 0 disables clipping and returns None."""
    if max_norm <= 0:
        return None
    return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
