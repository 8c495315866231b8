"""Device resolution, dtype choice, the missing-Neuron message and the peak FLOP/s table."""

from __future__ import annotations

import builtins
import importlib.util

import pytest
import torch

from trnfrontier.runtime import devices
from trnfrontier.runtime.recipe import RuntimeSpec


def test_cpu_resolves_to_float32_without_peak() -> None:
    spec = devices.resolve(RuntimeSpec(device="cpu", dtype="auto"))
    assert spec.device == torch.device("cpu")
    assert spec.dtype == torch.float32 and not spec.autocast
    assert spec.peak_flops is None
    assert spec.name == "cpu"


def test_explicit_bfloat16_on_cpu_autocasts() -> None:
    spec = devices.resolve(RuntimeSpec(device="cpu", dtype="bfloat16"))
    assert spec.dtype == torch.bfloat16 and spec.autocast
    with devices.autocast(spec.device, spec.dtype):
        y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16


def test_auto_falls_back_to_cpu_here() -> None:
    if torch.cuda.is_available() or importlib.util.find_spec("torch_neuronx") is not None:
        pytest.skip("an accelerator is present")
    assert devices.resolve_device("auto") == torch.device("cpu")


def test_missing_torch_neuronx_names_the_package_and_the_repository(monkeypatch) -> None:
    real_import = builtins.__import__

    def no_neuron(name, *args, **kwargs):
        if name == "torch_neuronx":
            raise ImportError("No module named 'torch_neuronx'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_neuron)
    with pytest.raises(devices.DeviceError) as info:
        devices.resolve_device("neuron")
    message = str(info.value)
    assert "torch-neuronx" in message and "pip.repos.neuron.amazonaws.com" in message
    assert devices.neuron_available() is False


def test_cuda_requested_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(devices.DeviceError, match="no CUDA device"):
        devices.resolve_device("cuda")


def test_unknown_names_are_refused() -> None:
    with pytest.raises(devices.DeviceError, match="unknown device"):
        devices.resolve_device("tpu")
    with pytest.raises(devices.DeviceError, match="unknown dtype"):
        devices.resolve_dtype(torch.device("cpu"), "float8")


def test_trainium_peak_is_split_per_logical_core() -> None:
    neuron = "neuron"  # torch parses torch.device("neuron") only once torch_neuronx is imported
    assert devices.peak_flops(neuron, lnc=2) == pytest.approx(667e12 / 4)
    assert devices.peak_flops(neuron, lnc=1) == pytest.approx(667e12 / 8)
    assert devices.peak_flops(torch.device("cpu")) is None


def test_synchronize_on_cpu_is_a_no_op() -> None:
    devices.synchronize(torch.device("cpu"))


@pytest.mark.parametrize(
    ("local_rank", "visible", "index"),
    [
        (0, 1, 0),
        (3, 1, 0),  # the runtime gave each process its own core (one visible per rank)
        (0, 4, 0),
        (3, 4, 3),  # several visible: one per local rank
    ],
)
def test_pick_device_index(local_rank: int, visible: int, index: int) -> None:
    assert devices.pick_device_index(local_rank, visible, "logical NeuronCore") == index


def test_pick_device_index_says_what_to_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with pytest.raises(
        devices.DeviceError,
        match=r"local rank 4 .* 4 visible with NEURON_LOGICAL_NC_CONFIG=2; lower --nproc or set runtime.lnc=1",
    ):
        devices.pick_device_index(4, 4, "logical NeuronCore")
    with pytest.raises(devices.DeviceError, match="no GPU is visible"):
        devices.pick_device_index(0, 0, "GPU")
