"""The optimizers of a run: Muon for the blocks' matrices, AdamW for the rest.

``build_optimizers(model, cfg["optim"])`` returns the list the trainer steps every
iteration; ``apply_schedule`` moves every group's LR (and Muon's momentum) for the next
step. Each param group remembers its base LR as ``group["initial_lr"]`` and its role as
``group["name"]`` (``matrix``, ``embedding``, ``unembedding``, ``scalar``) for logs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from trnfrontier.runtime.model import GPT
from trnfrontier.runtime.muon import Muon, set_group_value, set_hyperparams

# nanochat tuned its AdamW LRs at width 768; wider models take proportionally smaller steps.
REFERENCE_WIDTH = 768


def adamw_lr_scale(n_embd: int, enabled: bool) -> float:
    return (n_embd / REFERENCE_WIDTH) ** -0.5 if enabled else 1.0


def build_optimizers(model: GPT, optim_cfg: dict[str, Any]) -> list[torch.optim.Optimizer]:
    """[AdamW (embedding, unembedding, scalar groups), Muon (matrix group)].

    ``optim_cfg`` is the resolved recipe's ``optim`` section (plain dict). Muon starts at
    ``muon_momentum_warmup_start`` when a momentum warm-up is configured; the trainer
    moves it every step with ``apply_schedule``. Empty groups are left out.
    """
    groups = model.param_groups()
    scale = adamw_lr_scale(model.config.n_embd, bool(optim_cfg.get("lr_width_scaling", True)))
    adam_lrs = {
        "embedding": float(optim_cfg.get("embedding_lr", 0.2)) * scale,
        "unembedding": float(optim_cfg.get("unembedding_lr", 0.004)) * scale,
        "scalar": float(optim_cfg.get("scalar_lr", 0.5)) * scale,
    }
    adam_groups = [
        {"params": groups[name], "lr": lr, "initial_lr": lr, "name": name}
        for name, lr in adam_lrs.items()
        if groups[name]
    ]
    optimizers: list[torch.optim.Optimizer] = []
    if adam_groups:
        betas = tuple(float(b) for b in optim_cfg.get("adam_betas", (0.8, 0.95)))
        optimizers.append(
            torch.optim.AdamW(
                adam_groups,
                betas=betas,  # type: ignore[arg-type]
                eps=float(optim_cfg.get("adam_eps", 1e-10)),
                weight_decay=0.0,
                fused=False,
                # torch picks foreach where the device supports it (not every backend has
                # the _foreach kernels). Its LR stays a float: torch's AdamW refuses a
                # tensor LR with foreach, and apply_schedule handles both kinds.
                foreach=None,
            )
        )
    if groups["matrix"]:
        matrix_lr = float(optim_cfg.get("matrix_lr", 0.02))
        warmup_steps = int(optim_cfg.get("muon_momentum_warmup_steps", 0))
        momentum = float(optim_cfg.get("muon_momentum", 0.95))
        if warmup_steps > 0:
            momentum = float(optim_cfg.get("muon_momentum_warmup_start", momentum))
        muon = Muon(
            [{"params": groups["matrix"], "name": "matrix"}],
            lr=matrix_lr,
            momentum=momentum,
            weight_decay=float(optim_cfg.get("weight_decay", 0.0)),
            nesterov=bool(optim_cfg.get("nesterov", True)),
            ns_steps=int(optim_cfg.get("polar_express_steps", 5)),
            normuon=bool(optim_cfg.get("normuon", False)),
            beta2=float(optim_cfg.get("normuon_beta2", 0.95)),
            cautious_wd=bool(optim_cfg.get("cautious_weight_decay", False)),
        )
        for group in muon.param_groups:
            group["initial_lr"] = matrix_lr
        optimizers.append(muon)
    return optimizers


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


def current_lrs(optimizers: Iterable[torch.optim.Optimizer]) -> dict[str, float]:
    """{group name: current LR} for logging (reads Muon's tensor LR once)."""
    out: dict[str, float] = {}
    for opt in optimizers:
        for i, group in enumerate(opt.param_groups):
            name = group.get("name", f"{type(opt).__name__.lower()}{i}")
            lr = group["lr"]
            out[name] = float(lr.item() if isinstance(lr, Tensor) else lr)
    return out


def clip_grad_norm(parameters: Iterable[Tensor], max_norm: float) -> Tensor | None:
    """Clip the global gradient norm to ``max_norm`` and return the norm before clipping
    (a tensor: reading it is the caller's choice, it syncs on accelerators). ``max_norm``
    <= 0 disables clipping and returns None."""
    if max_norm <= 0:
        return None
    return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
