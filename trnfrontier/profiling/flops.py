"""Model FLOPs, the device peak they are measured against, and MFU.

The FLOP count is the model's own ``GPT.flops_per_token`` (one formula for the trainer's
logged MFU and this report); this module states it, finds the peak, and on CPU, where
no table entry is honest, measures one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from trnfrontier.runtime import devices

FLOPS_FORMULA = "6 x (params - embedding params) + 12 x n_layer x n_head x head_dim x seq_len (forward + backward, per token)"


@dataclass(frozen=True)
class Peak:
    """A peak FLOP/s figure and where it came from (a table, or a probe run just now)."""

    flops: float | None
    source: str


def matmul_probe(
    dtype: torch.dtype = torch.float32, size: int = 512, seconds: float = 0.5, trials: int = 5
) -> float:
    """Peak FLOP/s a square matmul reaches on this CPU, now, with this process's threads:
    the best of ``trials`` short bursts.

    A CPU has no honest table entry (cores, AVX width, clocks and neighbours vary), so MFU
    on CPU is measured against what a plain GEMM reaches in the same run. The best burst,
    not the average: on a shared machine a burst that lost its core to a neighbour would
    understate the peak and overstate the MFU.
    """
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)  # first call allocates and picks a kernel
    best = 0.0
    for _ in range(max(1, trials)):
        calls, started = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            calls += 1
            elapsed = time.perf_counter() - started
            if elapsed >= seconds / max(1, trials) and calls >= 2:
                break
        best = max(best, 2.0 * size**3 * calls / elapsed)
    return best


def device_peak(device: torch.device, dtype: torch.dtype, lnc: int) -> Peak:
    """The peak this process is measured against (one logical NeuronCore, one GPU, or the CPU probe)."""
    if device.type == "cpu":
        probe = matmul_probe(dtype)
        return Peak(probe, f"CPU: measured {dtype_name(dtype)} matmul probe in this run ({probe / 1e12:.3f} TFLOP/s), not a datasheet peak")
    flops = devices.peak_flops(device, lnc)
    if flops is None:
        return Peak(None, f"{devices.device_name(device)}: no peak in trnfrontier.runtime.devices; MFU not reported")
    if device.type == "neuron":
        cores = devices.TRN2_PHYSICAL_CORES // lnc
        source = f"Trn2 {devices.TRN2_CHIP_PEAK_FLOPS / 1e12:g} TFLOP/s dense BF16 per chip / {cores} logical cores (LNC={lnc})"
    else:
        source = f"{devices.device_name(device)}: {flops / 1e12:g} TFLOP/s dense BF16 (datasheet)"
    if dtype != torch.bfloat16:
        source += f"; this run computes in {dtype_name(dtype)}"
    return Peak(flops, source)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def mfu(flops_per_token: float, tokens_per_second: float, peak: Peak) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak (None without a peak)."""
    if not peak.flops:
        return None
    return flops_per_token * tokens_per_second / peak.flops
