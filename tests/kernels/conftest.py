"""Fixtures for kernel tests.

``interpreted(name)``: a kernel file executed by the NumPy interpreter (kernels/testing).
``interpreter_backend``: the trnf:: custom ops run their NKI path on the CPU, through the
interpreter, so the op glue (reshapes, dtypes, autograd) is tested with the real kernels.
``real_nki``: the ``nki`` module when importable (``nki.simulate`` tests), else skip.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from kernels.testing import HostTensor, InterpretedKernel, load_kernel_module, machine, versions
from kernels.testing.torch_bridge import interpreted_torch_module
from trnfrontier.runtime.kernels import backend, registration, reset_kernels


@pytest.fixture(scope="session")
def interpreted() -> Callable[..., ModuleType]:
    """``interpreted(name, nki_version=None)``: the shipped kernel file under the
    interpreter, held to this repository's portable style (kernels/testing/subset.py)."""
    cache: dict[tuple[str, str | None], ModuleType] = {}

    def get(name: str, nki_version: str | None = None) -> ModuleType:
        key = (name, nki_version)
        if key not in cache:
            cache[key] = load_kernel_module(name, nki_version=nki_version, portable=True)
        return cache[key]

    return get


# nki.simulate models the chip it finds, else the newest (trn3): pin the Trn2 rules
SIMULATOR_TARGET = {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"}


class SimulatedModule:
    """A kernel file loaded with the real nki; each kernel runs under nki.simulate on
    the Trn2 target, launched on the LNC grid."""

    def __init__(self, nki: ModuleType, module: ModuleType, lnc: int) -> None:
        self.nki, self.module, self.lnc = nki, module, lnc

    def __getattr__(self, attr: str) -> Any:
        fn = getattr(self.module, attr)
        if not callable(fn) or attr.startswith("_") or attr == "sbuf_bytes":
            return fn
        return lambda *args: self.nki.simulate(fn[self.lnc])(*[_simulator_arg(a) for a in args])


class LaunchedModule:
    """An interpreted kernel file whose kernels launch on an LNC grid of ``lnc``."""

    def __init__(self, module: ModuleType, lnc: int) -> None:
        self.module, self.lnc = module, lnc

    def __getattr__(self, attr: str) -> Any:
        fn = getattr(self.module, attr)
        return fn[self.lnc] if isinstance(fn, InterpretedKernel) else fn


def _simulator_arg(arg: Any) -> Any:
    if isinstance(arg, HostTensor) and arg.dtype is machine.bfloat16:
        try:
            import ml_dtypes  # shipped with AWS's nki for its bfloat16 arrays
        except ImportError:
            pytest.skip("bfloat16 inputs for nki.simulate need ml_dtypes")
        return arg.values.astype(ml_dtypes.bfloat16)
    return arg.values if isinstance(arg, HostTensor) else arg


@pytest.fixture(
    params=["interpreter-nki0.6-lnc1", "interpreter-nki0.7-lnc2", "nki.simulate-trn2-lnc2"]
)
def kernel(
    request: pytest.FixtureRequest, interpreted: Callable[..., ModuleType]
) -> Callable[[str], Any]:
    """Kernel files run by the NumPy interpreter under LNC 1 (NKI 0.6 rules) and LNC 2
    (NKI 0.7 rules): both versions and both grids without doubling the runtime; and by
    nki.simulate (Trn2 target, LNC 2) where nki is installed."""
    lnc = int(request.param[-1])
    if request.param.startswith("interpreter"):
        version = request.param.split("-")[1].removeprefix("nki")
        return lambda name: LaunchedModule(interpreted(name, version), lnc)
    nki = request.getfixturevalue("real_nki")
    patcher = request.getfixturevalue("monkeypatch")
    for key, value in SIMULATOR_TARGET.items():
        patcher.setenv(key, value)
    from trnfrontier.runtime.kernels.backend import load_kernel_file

    return lambda name: SimulatedModule(nki, load_kernel_file(name), lnc)


@pytest.fixture()
def interpreter_backend() -> Iterator[None]:
    """The ops' NKI path through the interpreter, every kernel ``on``: a kernel that fails
    must fail the test, not fall back to the reference (a test sets ``auto`` to check that)."""
    with backend.kernel_backend(interpreted_torch_module, {"cpu"}):
        for name in backend.KERNEL_NAMES:
            backend.set_mode(name, "on")
        try:
            yield
        finally:
            reset_kernels()


@pytest.fixture(autouse=True, scope="module")
def _default_nki_environment() -> Iterator[None]:
    """The tests assume NKI 0.6's rules and no LNC in the environment (the default, 2, and no
    0.7 mismatch check) unless they set them: a Neuron venv's shell may set either, or
    install nki 0.7, and must not change what they test. Per module, so that module-scoped
    fixtures (the budget tables) see it too, and undone after each module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(versions.ENV, versions.DEFAULT)
        patch.delenv(registration.LNC_ENV, raising=False)
        yield


@pytest.fixture(autouse=True)
def _clean_kernel_state() -> Iterator[None]:
    yield
    reset_kernels()


@pytest.fixture(scope="session")
def real_nki() -> ModuleType:
    # before the import, in case the simulator reads its target once (Trn2, not trn3)
    os.environ.update(SIMULATOR_TARGET)
    try:
        return importlib.import_module("nki")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(
            f"nki is not importable here ({type(exc).__name__}: {exc}); "
            "it comes only from AWS's Neuron pip repository, so nki.simulate tests run on a Neuron venv"
        )
