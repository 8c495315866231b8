"""The launch path a NeuronCore takes (``wrap_nki(kernel)[(lnc,)]``), with a counting fake
of torch-neuronx's ``wrap_nki`` (the real one is not installable here): each (kernel, LNC,
static shape) is wrapped once however many calls follow, the grid is always a tuple, and
a wrap or launch that fails falls back under ``auto`` (once, naming the call) and stops
under ``on``."""

from __future__ import annotations

import warnings
from collections import Counter
from typing import Any

import pytest
import torch

from kernels.testing.torch_bridge import interpreted_torch_module
from trnfrontier.runtime import ops
from trnfrontier.runtime.kernels import (
    KernelFallbackWarning,
    KernelUnavailableError,
    backend,
    custom_ops,
    registration,
)


class FakeWrapNki:
    """Stands in for torch_neuronx's wrap_nki: counts wraps, converts the grid the way one
    stored torch-neuronx does (``tuple(map(int, grid))``, which raises on a bare int)."""

    def __init__(self, fail: str | None = None) -> None:
        self.wraps: Counter[str] = Counter()
        self.fail = fail

    def __call__(self, kernel: Any) -> Any:
        self.wraps[kernel.fn.__name__] += 1
        if self.fail == "wrap":
            raise RuntimeError("NKI tracing failed\n  (a multi-line compiler message)")
        return _Wrapped(kernel, self.fail)


class _Wrapped:
    def __init__(self, kernel: Any, fail: str | None) -> None:
        self.kernel, self.fail = kernel, fail

    def __getitem__(self, grid: Any) -> Any:
        grid = tuple(map(int, grid))
        if self.fail == "launch":
            return lambda *args: (_ for _ in ()).throw(RuntimeError("NEFF load failed"))
        return self.kernel[grid]


@pytest.fixture()
def fake_neuron(monkeypatch: pytest.MonkeyPatch):
    def install(fail: str | None = None) -> FakeWrapNki:
        fake = FakeWrapNki(fail)
        monkeypatch.setattr(
            registration,
            "_torch_neuronx_attr",
            lambda name: fake if name == "wrap_nki" else None,
        )
        return fake

    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    with backend.kernel_backend(
        interpreted_torch_module, {"cpu"}, launcher=registration.neuron_launcher
    ):
        yield install


def test_each_kernel_is_wrapped_once_per_lnc_and_shape(fake_neuron, monkeypatch) -> None:
    fake = fake_neuron()
    backend.set_mode("relu2", "on")
    for _ in range(12):
        x = torch.randn(130, 16, requires_grad=True)
        custom_ops.relu_squared(x).sum().backward()
    assert fake.wraps == {"relu2_fwd": 1, "relu2_bwd": 1}
    custom_ops.relu_squared(torch.randn(4, 16))  # a new static shape: one more wrap
    assert fake.wraps["relu2_fwd"] == 2
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")  # another LNC: another wrap
    custom_ops.relu_squared(torch.randn(4, 16))
    assert fake.wraps["relu2_fwd"] == 3


def test_a_bare_int_grid_is_what_the_stored_wrap_nki_rejects() -> None:
    with pytest.raises(TypeError):
        FakeWrapNki()(_Named())[2]


class _Named:
    fn = custom_ops  # anything with a __name__

    def __getitem__(self, grid: Any) -> Any:
        return grid


@pytest.mark.parametrize("fail", ["wrap", "launch"])
def test_a_failing_wrap_or_launch_falls_back_under_auto_once(fake_neuron, fail: str) -> None:
    fake = fake_neuron(fail)
    backend.set_mode("relu2", "auto")
    x = torch.randn(4, 8)
    with pytest.warns(KernelFallbackWarning) as caught:
        y = custom_ops.relu_squared(x)
    text = str(caught[0].message)
    assert "relu2.relu2_fwd[(2,)]((4, 8) float32)" in text, text
    assert registration.torch_neuronx_version() in text and "\n" not in text
    torch.testing.assert_close(y, ops.reference("relu_squared")(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(custom_ops.relu_squared(x), y)  # said once, not retried
    assert fake.wraps["relu2_fwd"] == 1


def test_a_failing_launch_stops_an_on_recipe_with_one_line(fake_neuron) -> None:
    fake_neuron("launch")
    backend.set_mode("relu2", "on")
    with pytest.raises(KernelUnavailableError) as raised:
        custom_ops.relu_squared(torch.randn(4, 8))
    message = str(raised.value)
    assert message.startswith("kernels.relu2: on, but relu2.relu2_fwd[(2,)]((4, 8) float32)")
    assert "NEFF load failed" in message and "kernels.relu2: auto" in message
    assert "\n" not in message
