"""Each kernel's custom op against its plain PyTorch reference on one device (``trnf profile --kernels``).

``benchmark_kernels(device)`` times, per kernel, the ``trnf::`` op (the NKI kernel on
Neuron; the reference elsewhere, which the ``impl`` field says) and the model's plain
implementation on the same inputs, then reports achieved memory bandwidth or FLOP/s
and the share of the device's peak. Shapes are the baseline_d10 model's (one step's
worth for one core) on accelerators and a small slice of them on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from .. import devices, ops
from ..muon import polar_express_coeffs
from . import backend, custom_ops, references

# HBM bandwidth per chip/GPU, bytes/s (Trn2: 2.9 TB/s shared by 8 physical cores).
TRN2_CHIP_HBM_BPS = 2.9e12
CUDA_HBM_BPS = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L4": 0.3e12, "A10G": 0.6e12}


def peak_bandwidth(device: torch.device, lnc: int = 2) -> float | None:
    """HBM bytes/s available to one process on ``device`` (None when unknown)."""
    if device.type == "neuron":
        return TRN2_CHIP_HBM_BPS / (devices.TRN2_PHYSICAL_CORES // lnc)
    if device.type == "cuda":
        return devices.by_gpu_name(CUDA_HBM_BPS, device)
    return None


def _time(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Median seconds per call after one warm-up call (compilation, caches)."""
    fn()
    devices.synchronize(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        devices.synchronize(device)
        samples.append(time.perf_counter() - start)
    samples.sort()
    return samples[len(samples) // 2]


def _cases(device: torch.device, dtype: torch.dtype) -> list[dict[str, Any]]:
    small = device.type == "cpu"
    B, T = (2, 256) if small else (16, 1024)
    width, heads, kv_heads, head_dim, vocab = 640, 5, 5, 128, 8192
    rows = B * T
    mk = lambda *shape, dt=dtype: torch.randn(*shape, device=device, dtype=dt)  # noqa: E731
    item = torch.tensor([], dtype=dtype).element_size()
    x = mk(rows, 4 * width)
    h = mk(rows, width)
    q = mk(B, heads, T, head_dim)
    k, v = mk(B, kv_heads, T, head_dim), mk(B, kv_heads, T, head_dim)
    half = head_dim // 2
    ang = torch.rand(T, half, device=device) * 6.28
    cos, sin = ang.cos()[None, None], ang.sin()[None, None]
    logits = mk(rows, vocab, dt=torch.float32)
    targets = torch.randint(0, vocab, (rows,), device=device)
    pm = 128 if small else width  # Polar Express of one [pm, 4 pm] MLP matrix
    g = mk(pm, 4 * pm)
    pe_flops = 5 * (
        4 * pm * pm * 4 * pm + 2 * pm**3
    )  # per step: X X^T and B X (2 m^2 n each), A A (2 m^3)
    attn_flops = 4 * B * heads * T * T * head_dim // 2  # causal: half of QK^T and PV
    return [
        dict(
            name="relu2",
            shape=tuple(x.shape),
            bytes=2 * x.numel() * item,
            flops=None,
            op=lambda: custom_ops.relu_squared(x),
            ref=lambda: ops.reference("relu_squared")(x),
        ),
        dict(
            name="rmsnorm",
            shape=tuple(h.shape),
            bytes=2 * h.numel() * item,
            flops=None,
            op=lambda: custom_ops.rms_norm(h),
            ref=lambda: ops.reference("rms_norm")(h),
        ),
        dict(
            name="rope_qknorm",
            shape=tuple(q.shape),
            bytes=2 * q.numel() * item,
            flops=None,
            op=lambda: custom_ops.rotary_rms_norm(q, cos, sin),
            ref=lambda: ops.reference("rms_norm")(ops.reference("apply_rotary")(q, cos, sin)),
        ),
        dict(
            name="cross_entropy",
            shape=tuple(logits.shape),
            bytes=logits.numel() * 4,
            flops=None,
            op=lambda: custom_ops.cross_entropy(logits, targets),
            ref=lambda: ops.reference("cross_entropy")(logits, targets),
        ),
        dict(
            name="attention",
            shape=tuple(q.shape),
            bytes=None,
            flops=attn_flops,
            op=lambda: custom_ops.causal_attention(q, k, v),
            ref=lambda: ops.reference("causal_attention")(q, k, v),
        ),
        dict(
            name="polar_express",
            shape=tuple(g.shape),
            bytes=None,
            flops=pe_flops,
            op=lambda: custom_ops.polar_express(g),
            ref=lambda: references.polar_express(g, polar_express_coeffs(5), 1e-7),
        ),
    ]


def benchmark_kernels(
    device: torch.device | str, repeats: int = 5, lnc: int = 2, dtype: torch.dtype | None = None
) -> list[dict[str, Any]]:
    """One dict per kernel: name, shape, impl, kernel_ms, reference_ms, speedup, and
    achieved_gbps or achieved_tflops with peak_fraction (None where the peak is unknown)."""
    device = torch.device(device)
    dtype = dtype or (torch.float32 if device.type == "cpu" else torch.bfloat16)
    peak_bw, peak_fl = peak_bandwidth(device, lnc), devices.peak_flops(device, lnc)
    results = []
    with torch.no_grad():
        for case in _cases(device, dtype):
            name = case["name"]
            impl = (
                "nki"
                if backend.wants_kernel(device.type) and backend.kernel_importable(name) is None
                else "reference"
            )
            t_op = _time(case["op"], device, repeats)
            t_ref = _time(case["ref"], device, repeats)
            row: dict[str, Any] = {
                "name": name,
                "shape": list(case["shape"]),
                "dtype": str(dtype).replace("torch.", ""),
                "device": device.type,
                "impl": impl,
                "kernel_ms": t_op * 1e3,
                "reference_ms": t_ref * 1e3,
                "speedup": t_ref / t_op if t_op > 0 else None,
            }
            if case["bytes"] is not None:
                row["achieved_gbps"] = case["bytes"] / t_op / 1e9
                row["peak_fraction"] = case["bytes"] / t_op / peak_bw if peak_bw else None
            else:
                row["achieved_tflops"] = case["flops"] / t_op / 1e12
                row["peak_fraction"] = case["flops"] / t_op / peak_fl if peak_fl else None
            results.append(row)
    return results
