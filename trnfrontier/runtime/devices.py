"""Devices: which one a run uses, at what precision, how to wait for it, and its peak FLOP/s.

``cpu``, ``cuda`` and ``neuron`` (PyTorch's native Neuron backend, registered by
``import torch_neuronx``), or ``auto`` (neuron, then cuda, then cpu). The Neuron packages
come only from AWS's Neuron pip repository, so they are imported lazily and their absence
is reported with the package name and where to get it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from types import ModuleType

import torch

from trnfrontier.runtime.recipe import RuntimeSpec

NEURON_PIP_HINT = (
    "torch-neuronx is not installed; it comes only from AWS's Neuron pip repository: "
    "pip install --extra-index-url https://pip.repos.neuron.amazonaws.com torch-neuronx "
    "(the PyPI name is an empty placeholder), or use a Trainium DLAMI's Neuron venv"
)

# Dense BF16 peak FLOP/s. A Trn2 chip is 8 physical NeuronCores; with LNC=2 (the default)
# it shows 4 logical cores, with LNC=1 eight, and each process drives one logical core.
TRN2_CHIP_PEAK_FLOPS = 667e12
TRN2_PHYSICAL_CORES = 8
CUDA_PEAK_FLOPS = {  # by a substring of torch.cuda.get_device_name()
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L4": 121e12,
    "A10G": 70e12,
}


class DeviceError(RuntimeError):
    """The requested device cannot be used here (the message says why and what to do)."""


@dataclass(frozen=True)
class DeviceSpec:
    """What the trainer needs to know about its device."""

    device: torch.device
    dtype: torch.dtype  # the compute dtype: autocast to it when it is not float32
    peak_flops: float | None  # per process (one logical core / one GPU); None when unknown
    name: str  # human-readable, for summary.json

    @property
    def type(self) -> str:
        return self.device.type

    @property
    def autocast(self) -> bool:
        return self.dtype != torch.float32


def import_neuron() -> ModuleType:
    """Import torch_neuronx (registers the ``neuron`` device and distributed backend)."""
    try:
        import torch_neuronx
    except ImportError as exc:
        raise DeviceError(
            f"device 'neuron' needs torch-neuronx ({exc}). {NEURON_PIP_HINT}"
        ) from None
    return torch_neuronx


def neuron_available() -> bool:
    """True when torch_neuronx imports and shows at least one logical core."""
    try:
        import_neuron()
    except DeviceError:
        return False
    try:
        return torch.accelerator.device_count() > 0
    except Exception:  # noqa: BLE001 - an odd install must not break `auto`
        return False


def pick_device_index(local_rank: int, visible: int, what: str) -> int:
    """Which of the ``visible`` devices this process (``local_rank``) drives.

    - one device visible: the launcher or runtime already gave each process its own
      (``NEURON_RT_VISIBLE_CORES`` / ``CUDA_VISIBLE_DEVICES`` per rank): index 0 for every
      rank, whatever the rank is;
    - several visible: one per local rank, as the TorchNeuron and CUDA examples do
      (device ``local_rank``);
    - fewer than the local ranks need: an error that says what to change.
    """
    if visible < 1:
        raise DeviceError(f"no {what} is visible to this process")
    if visible == 1:
        return 0
    if local_rank < visible:
        return local_rank
    lnc = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2")
    hint = f" with NEURON_LOGICAL_NC_CONFIG={lnc}" if "Neuron" in what else ""
    raise DeviceError(
        f"local rank {local_rank} has no {what}: {visible} visible{hint}; lower --nproc"
        + (" or set runtime.lnc=1" if hint else "")
        + ", or give each process its own device"
    )


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto``/``cpu``/``cuda``/``neuron`` -> a torch.device for this process (one per local rank)."""
    if name == "auto":
        if neuron_available():
            name = "neuron"
        elif torch.cuda.is_available():
            name = "cuda"
        else:
            name = "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                "runtime.device=cuda but torch sees no CUDA device; use runtime.device=cpu or auto"
            )
        index = pick_device_index(local_rank, torch.cuda.device_count(), "GPU")
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if name == "neuron":
        import_neuron()
        count = torch.accelerator.device_count()
        if count < 1:
            raise DeviceError(
                "torch-neuronx is installed but shows no NeuronCore; is this a Trainium instance?"
            )
        index = pick_device_index(local_rank, count, "logical NeuronCore")
        torch.accelerator.set_device_index(index)
        return torch.device("neuron", index)
    raise DeviceError(f"unknown device {name!r}; choose cpu, cuda, neuron or auto")


def resolve_dtype(device: torch.device, name: str) -> torch.dtype:
    """``auto`` is bfloat16 where the device computes it natively (Neuron, CUDA sm80+), else float32.

    CPU stays float32 under ``auto``: bf16 autocast there is slower and changes results
    across machines, and the CPU path exists for determinism and tests.
    """
    if name == "float32":
        return torch.float32
    if name == "bfloat16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise DeviceError(
                f"runtime.dtype=bfloat16 but {torch.cuda.get_device_name(device)} has no bf16; use float32"
            )
        return torch.bfloat16
    if name != "auto":
        raise DeviceError(f"unknown dtype {name!r}; choose auto, float32 or bfloat16")
    if device.type == "neuron":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[object]:
    """Mixed precision for the forward pass; weights and optimizer state stay float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def synchronize(device: torch.device) -> None:
    """Wait for queued work, so a step boundary's timestamp means the step is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu":
        torch.accelerator.synchronize(device)


def peak_flops(device: torch.device | str, lnc: int = 2) -> float | None:
    """Dense BF16 peak FLOP/s of the part of the chip this process drives (None: unknown).

    ``device`` may be a device type name: torch cannot even parse ``"neuron"`` until
    torch_neuronx is imported."""
    kind = device if isinstance(device, str) else device.type
    if kind == "neuron":
        logical_cores = TRN2_PHYSICAL_CORES // lnc
        return TRN2_CHIP_PEAK_FLOPS / logical_cores
    if kind == "cuda":
        return by_gpu_name(CUDA_PEAK_FLOPS, device if isinstance(device, torch.device) else None)
    return None


def by_gpu_name(table: dict[str, float], device: torch.device | None) -> float | None:
    """The value of the first key of ``table`` found in the CUDA device's name (None: none)."""
    name = torch.cuda.get_device_name(device)
    return next((value for key, value in table.items() if key in name), None)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "neuron":
        return f"neuron (LNC={os.environ.get('NEURON_LOGICAL_NC_CONFIG', '2')})"
    return "cpu"


def resolve(runtime: RuntimeSpec, local_rank: int = 0) -> DeviceSpec:
    """The resolved recipe's ``runtime`` section -> the DeviceSpec this process trains on."""
    device = resolve_device(runtime.device, local_rank)
    return DeviceSpec(
        device=device,
        dtype=resolve_dtype(device, runtime.dtype),
        peak_flops=peak_flops(device, runtime.lnc),
        name=device_name(device),
    )
