"""Muon: momentum SGD whose update for each weight matrix is replaced by (nearly) the
closest semi-orthogonal matrix, computed with the Polar Express iteration.

Per-step hyperparameters (``lr``, ``momentum``, ``weight_decay``) are 0-d float32 tensors
on the parameters' device, held in each param group and changed in place with
``set_hyperparams``. A ``torch.compile``'d step therefore sees the same tensor objects
every step and is never re-traced when the schedule moves.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from trnfrontier.runtime.recipe import OptimSpec

# Polar Express (Amsel, Persson, Musco, Gower 2025): per-iteration quintic coefficients
# (a, b, c) for X <- a X + b (X X^T) X + c (X X^T)^2 X, tuned so that singular values in
# (0, 1] move towards 1 as fast as possible over five iterations.
POLAR_EXPRESS_COEFFS: tuple[tuple[float, float, float], ...] = (
    (8.1566, -22.4833, 15.8788),
    (4.0429, -2.8089, 0.5000),
    (3.8917, -2.7725, 0.5061),
    (3.2858, -2.3681, 0.4645),
    (2.3465, -1.7098, 0.4232),
)

HYPERPARAMS = ("lr", "momentum", "weight_decay")
# The recipe's defaults (runtime/recipe.py) are Muon's: one definition of each.
_OPTIM = OptimSpec()


def _cpu_multiplies_bfloat16() -> bool:
    """Whether this CPU has bfloat16 dot products (AVX512-BF16 or AMX), which oneDNN uses
    for bfloat16 matmuls; without them it emulates bfloat16, slower than float32."""
    cpu = getattr(torch, "cpu", None)
    checks = (getattr(cpu, "_is_avx512_bf16_supported", None), getattr(cpu, "_is_amx_tile_supported", None))
    return any(check is not None and bool(check()) for check in checks)


# Polar Express runs in bfloat16 on accelerators and on a CPU that multiplies it natively:
# the iteration is robust to it (nanochat runs it in bfloat16 everywhere), and there it is
# twice as fast (54 ms against 111 ms a step for the four Muon buckets of a depth-4,
# width-256 model, 2 threads, AVX512-BF16). Any other CPU stays in float32, and so does
# every CPU with TRNF_CPU_POLAR=float32 (to compare runs across machines bit for bit).
POLAR_ENV = "TRNF_CPU_POLAR"
CPU_POLAR_DTYPE = (
    torch.bfloat16
    if os.environ.get(POLAR_ENV, "").strip().lower() != "float32" and _cpu_multiplies_bfloat16()
    else torch.float32
)


def polar_dtype(device: torch.device) -> torch.dtype:
    """The dtype Polar Express computes in on ``device``."""
    return CPU_POLAR_DTYPE if device.type == "cpu" else torch.bfloat16


def polar_express_coeffs(steps: int) -> tuple[tuple[float, float, float], ...]:
    """The coefficients of the first ``steps`` iterations (1 to 5)."""
    if not 1 <= steps <= len(POLAR_EXPRESS_COEFFS):
        raise ValueError(f"steps={steps} must be in [1, {len(POLAR_EXPRESS_COEFFS)}]")
    return POLAR_EXPRESS_COEFFS[:steps]


def polar_express(G: Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype | None = None) -> Tensor:
    """Approximate the orthogonal polar factor U V^T of ``G`` (..., rows, cols).

    Normalises by the Frobenius norm (so every singular value is <= 1), then applies the
    first ``steps`` quintic iterations. Works on a batch of same-shaped matrices. Computes
    in ``dtype`` (default ``polar_dtype(G.device)``) and returns the input's dtype.

    The normalisation runs in float32 (or the input's wider dtype) before the cast to
    ``dtype``, as the NKI kernel and the reference do: each matrix's result then has the
    same bits however many matrices share the call, compiled or not (inductor reduces a
    bfloat16 norm in an order that depends on the batch), which the sharded optimizer,
    where each rank orthogonalises only its share of a bucket, relies on.
    """
    if G.dim() < 2:
        raise ValueError(f"polar_express needs a matrix, got shape {tuple(G.shape)}")
    coeffs = polar_express_coeffs(steps)
    X = G if G.dtype in (torch.float32, torch.float64) else G.float()
    # Work on the wide orientation: X X^T is then the smaller Gram matrix.
    transposed = X.size(-2) > X.size(-1)
    if transposed:
        X = X.mT
    X = (X / (X.norm(dim=(-2, -1), keepdim=True) + eps)).to(dtype or polar_dtype(G.device))
    batch_shape = X.shape[:-2]
    X = X.reshape(-1, *X.shape[-2:])  # one batched-matmul code path for 2-D and stacked
    for a, b, c in coeffs:
        A = X @ X.mT
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A^2, fused
        X = torch.baddbmm(X, B, X, beta=a, alpha=1.0)  # a X + B X, fused
    X = X.reshape(*batch_shape, *X.shape[-2:])
    if transposed:
        X = X.mT
    return X.to(G.dtype)


def _as_hyper_tensor(value: Any, device: torch.device) -> Tensor:
    return torch.tensor(float(value), dtype=torch.float32, device=device)


def set_group_value(group: dict[str, Any], name: str, value: float) -> None:
    """Set one hyperparameter of a param group: a tensor entry (Muon's) is filled in place,
    keeping the object a compiled step holds; a plain float (torch's AdamW) is replaced."""
    current = group[name]
    if isinstance(current, Tensor):
        current.fill_(float(value))
    else:
        group[name] = float(value)


def set_hyperparams(optimizer: torch.optim.Optimizer, **values: float) -> None:
    """Set per-step hyperparameters on every param group of ``optimizer``
    (``set_group_value``). Unknown names are an error so a typo never silently leaves a
    schedule unapplied.
    """
    for group in optimizer.param_groups:
        for name, value in values.items():
            if name not in group:
                raise KeyError(
                    f"{type(optimizer).__name__} param group has no hyperparameter {name!r}"
                )
            set_group_value(group, name, value)


class Muon(torch.optim.Optimizer):
    """Muon for 2-D (or higher, flattened to rows x rest) weight matrices.

    Per step, for each parameter W with gradient G:
      buf <- momentum * buf + (1 - momentum) * G
      M   <- (1 - momentum) * G + momentum * buf   (Nesterov)   or   buf
      O   <- polar_express(M)
      NorMuon (optional): v <- beta2 * v + (1 - beta2) * mean_row(O^2); O <- O / sqrt(v),
                          then rescaled so that ||O||_F is unchanged
      W   <- W - lr * wd * W * mask - lr * max(1, rows/cols)^0.5 * O
    where mask is 1 everywhere, or (cautious weight decay) 1 only where sign(O) == sign(W),
    i.e. where the update already moves the weight towards zero. The momentum warm-up is
    the caller's job: it sets ``momentum`` through ``set_hyperparams`` every step.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float = _OPTIM.matrix_lr,
        momentum: float = _OPTIM.muon_momentum,
        weight_decay: float = _OPTIM.weight_decay,
        nesterov: bool = _OPTIM.nesterov,
        ns_steps: int = _OPTIM.polar_express_steps,
        normuon: bool = _OPTIM.normuon,
        beta2: float = _OPTIM.normuon_beta2,
        cautious_wd: bool = _OPTIM.cautious_weight_decay,
        eps: float = 1e-10,
    ) -> None:
        if lr <= 0 or not 0.0 <= momentum < 1.0 or weight_decay < 0 or not 0.0 <= beta2 < 1.0:
            raise ValueError(
                f"bad Muon hyperparameters: lr={lr}, momentum={momentum}, weight_decay={weight_decay}, beta2={beta2}"
            )
        defaults = dict(
            lr=lr,
            momentum=momentum,
            weight_decay=weight_decay,
            nesterov=nesterov,
            ns_steps=ns_steps,
            normuon=normuon,
            beta2=beta2,
            cautious_wd=cautious_wd,
            eps=eps,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            if any(p.dim() < 2 for p in group["params"]):
                raise ValueError(
                    "Muon takes only matrices (dim >= 2); give vectors and scalars to AdamW"
                )
            device = group["params"][0].device if group["params"] else torch.device("cpu")
            # One tensor per group and name: never shared between groups.
            for name in HYPERPARAMS:
                group[name] = _as_hyper_tensor(group[name], device)
            # State is created up front, not on the first step, so that a compiled step
            # sees the same state structure from its first call (no recompile at step 2).
            for p in group["params"]:
                self._init_state(p, group)
        # The per-bucket update; compiling.compile_optimizers swaps in a compiled copy.
        self.update_fn: Callable[..., None] = muon_update

    def _init_state(self, p: Tensor, group: dict[str, Any]) -> dict[str, Tensor]:
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        if group["normuon"] and "second_moment" not in state:
            state["second_moment"] = torch.zeros(
                p.shape[0], 1, dtype=torch.float32, device=p.device
            )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load state, then copy the saved hyperparameters into the existing tensors so
        that a compiled step keeps seeing the same objects after a resume."""
        keep = [{name: group[name] for name in HYPERPARAMS} for group in self.param_groups]
        super().load_state_dict(state_dict)
        for group, old in zip(self.param_groups, keep, strict=True):
            for name, tensor in old.items():
                tensor.copy_(torch.as_tensor(group[name], dtype=torch.float32))
                group[name] = tensor

    @torch.no_grad()
    def step(self, closure: Any = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group: dict[str, Any]) -> None:
        # Same-shaped matrices are updated together: one batched orthogonalisation each.
        buckets: dict[tuple[int, ...], list[Tensor]] = defaultdict(list)
        for p in group["params"]:
            if p.grad is not None:
                self._init_state(p, group)
                buckets[tuple(p.shape)].append(p)
        for params in buckets.values():
            self.update_bucket(group, params, [p.grad for p in params], [self.state[p] for p in params])

    def update_bucket(self, group: dict[str, Any], params: list[Tensor], grads: list[Tensor], states: list[dict[str, Tensor]]) -> None:
        """``update_fn`` with ``group``'s hyperparameters over same-shaped ``params`` (a whole
        bucket, or the share a sharded optimizer's rank owns), their gradients and state."""
        self.update_fn(
            params,
            grads,
            [s["momentum_buffer"] for s in states],
            [s["second_moment"] for s in states] if group["normuon"] else [],
            group["lr"],
            group["momentum"],
            group["weight_decay"],
            group["beta2"],
            nesterov=group["nesterov"],
            ns_steps=group["ns_steps"],
            cautious_wd=group["cautious_wd"],
            eps=group["eps"],
        )


def muon_update(
    params: list[Tensor],
    grads: list[Tensor],
    bufs: list[Tensor],
    second_moments: list[Tensor],
    lr: Tensor,
    momentum: Tensor,
    weight_decay: Tensor,
    beta2: float,
    *,
    nesterov: bool,
    ns_steps: int,
    cautious_wd: bool,
    eps: float,
) -> None:
    """One Muon step, in place, for same-shaped ``params`` (see ``Muon``). A pure function
    of its tensors, so ``torch.compile`` can compile it once per bucket shape (hyper-
    parameters are 0-d tensors: a moving schedule never re-traces it). NorMuon is on when
    ``second_moments`` (one [rows, 1] tensor per param) is not empty."""
    shape = params[0].shape
    rows, cols = shape[0], math.prod(shape[1:])
    decay = lr * weight_decay
    updates = []
    for g, buf in zip(grads, bufs, strict=True):
        buf.lerp_(g, (1.0 - momentum).to(g.dtype))
        updates.append(g.lerp(buf, momentum.to(g.dtype)) if nesterov else buf)
    stacked = torch.stack([u.reshape(rows, cols) for u in updates])
    # Looked up as a module global on purpose: the kernels layer swaps
    # ``muon.polar_express`` for an NKI op, so never bind it locally.
    ortho = polar_express(stacked, steps=ns_steps).float()
    if second_moments:
        ortho = _normuon(ortho, second_moments, beta2, eps)
    step_size = lr * max(1.0, rows / cols) ** 0.5
    for p, o in zip(params, ortho.unbind(0), strict=True):
        o = o.view(shape).to(p.dtype)
        if cautious_wd:
            mask = (torch.sign(o) == torch.sign(p)).to(p.dtype)
            p.sub_(p * mask * decay.to(p.dtype))
        else:
            p.mul_(1.0 - decay.to(p.dtype))
        p.sub_(o * step_size.to(p.dtype))


def _normuon(ortho: Tensor, second_moments: list[Tensor], beta2: float, eps: float) -> Tensor:
    """Per-row (output neuron) adaptive scaling of the orthogonalised updates [N, rows,
    cols], keeping each update's Frobenius norm; updates the second moments in place."""
    row_sq = ortho.square().mean(dim=-1, keepdim=True)  # [N, rows, 1]
    out = []
    for i, v in enumerate(second_moments):
        v.lerp_(row_sq[i], 1.0 - beta2)
        scaled = ortho[i] / (v.sqrt() + eps)
        scaled = scaled * (ortho[i].norm() / (scaled.norm() + eps))
        out.append(scaled)
    return torch.stack(out)
