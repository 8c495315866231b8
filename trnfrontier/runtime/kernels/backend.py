"""Where NKI kernels come from, on which devices they run, and what happens when they can't.

The kernel files live in the repository's ``kernels/`` directory (beside a submission's
train.py). They are loaded by path, lazily, the first time an op runs on a device that
has them, with the real ``nki`` package; nothing here imports ``nki`` at module import.

Per kernel there is a *mode* (the recipe's ``kernels:`` choice, set by ``use_kernels``):

- ``off`` / ``auto``: a shape the kernel does not support runs the reference, with one
  warning per op and shape (:class:`KernelFallbackWarning`);
- ``on``: the same situation raises :class:`KernelUnavailableError` naming op and shape.

Kernels are launched through :func:`run`: each (kernel, LNC, static shape) is wrapped
once (``registration.neuron_launcher``: ``wrap_nki(kernel)[(lnc,)]``) and the wrapped
launcher reused for every later call. A wrap or launch that raises is remembered for
that key; under ``auto`` the op says so once (naming the torch-neuronx version and the
call) and runs its PyTorch reference, under ``on`` it stops with one line.

Tests swap the loader (``kernel_backend``) to run the same op glue through the NumPy
interpreter in ``kernels/testing`` on the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from ..recipe import KernelsSpec
from . import registration

# The recipe's kernels section (runtime/recipe.py KernelsSpec) names them.
KERNEL_NAMES = tuple(field.name for field in dataclasses.fields(KernelsSpec))
KERNELS_ENV = "TRNF_KERNELS_DIR"
# Trn2's usable SBUF per partition (KLR's tile_size.total_available_sbuf_size for
# NeuronCore-v3; the interpreter's machine.TRN2 holds the same figure, a test keeps them equal)
SBUF_BYTES_PER_PARTITION = 212_984
PMAX = 128


class KernelUnavailableError(RuntimeError):
    """The recipe demanded an NKI kernel (``on``) that cannot run here or for this shape."""


class KernelFallbackWarning(UserWarning):
    """A kernel fell back to its PyTorch reference (said once per op and shape)."""


def kernels_dir() -> Path:
    """Where the kernel files are: ``$TRNF_KERNELS_DIR``, else the first ``kernels/`` that
    exists at the repository root, inside an installed wheel (``trnfrontier/_shipped/``),
    beside this file (a packaged train.py inlines this module), or in the working directory."""
    env = os.environ.get(KERNELS_ENV)
    if env:
        return Path(env).expanduser().resolve()
    here = Path(__file__).resolve()
    candidates = (
        [here.parents[3] / "kernels", here.parents[2] / "_shipped" / "kernels"]
        if len(here.parents) > 3
        else []
    )
    candidates += [here.parent / "kernels", Path.cwd() / "kernels"]
    return next((c for c in candidates if (c / "relu2.py").is_file()), candidates[0])


def load_kernel_file(name: str) -> ModuleType:
    """Import ``kernels/<name>.py`` with the real ``nki`` (raises ImportError without it)."""
    import nki  # noqa: F401  (fail here, with the package name, not deep in the kernel file)

    path = kernels_dir() / f"{name}.py"
    if not path.is_file():
        raise ImportError(
            f"NKI kernel file {path} not found (set {KERNELS_ENV} to the kernels directory)"
        )
    spec = importlib.util.spec_from_file_location(f"trnf_nki_kernels.{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Launcher = Callable[[Any, tuple[int, ...]], Any]


class _Backend:
    loader: Callable[[str], Any] = staticmethod(load_kernel_file)
    launcher: Launcher = staticmethod(registration.neuron_launcher)
    devices: frozenset[str] = frozenset({"neuron"})
    modules: dict[str, Any] = {}
    modes: dict[str, str] = {}
    warned: set[tuple[str, str]] = set()
    # (module, kernel, grid, static arguments) -> the wrapped launcher, or why it failed
    launchers: dict[tuple[Any, ...], Any] = {}
    failed: dict[tuple[Any, ...], str] = {}


BACKEND = _Backend()


def set_mode(name: str, mode: str) -> None:
    if name not in KERNEL_NAMES or mode not in ("off", "auto", "on"):
        raise ValueError(
            f"kernel {name!r} mode {mode!r}: expected one of {KERNEL_NAMES} and off|auto|on"
        )
    BACKEND.modes[name] = mode


def mode(name: str) -> str:
    return BACKEND.modes.get(name, "auto")


def kernel_module(name: str) -> Any:
    if name not in BACKEND.modules:
        BACKEND.modules[name] = BACKEND.loader(name)
    return BACKEND.modules[name]


def _static(arg: Any) -> Any:
    """What a kernel is specialised on: a tensor's shape and dtype, a constant's value."""
    shape = getattr(arg, "shape", None)
    if shape is not None and hasattr(arg, "dtype"):
        return (tuple(int(s) for s in shape), str(arg.dtype))
    return arg if isinstance(arg, (int, float, bool, str, type(None))) else repr(arg)


def _call_text(module: str, fn_name: str, grid: tuple[int, ...], args: tuple[Any, ...]) -> str:
    shown = []
    for a in args:
        st = _static(a)
        shown.append(f"{st[0]} {st[1].replace('torch.', '')}" if isinstance(st, tuple) else repr(st))
    return f"{module}.{fn_name}[{grid}]({', '.join(shown)})"


def run(op: str, module: str, fn_name: str, *args: Any) -> Any:
    """Kernel ``fn_name`` of ``kernels/<module>.py`` on the LNC grid, or None when wrapping
    or launching it failed under ``auto`` (the caller then runs the reference).

    The wrapped launcher is kept per (kernel, grid, static shape): wrapping re-traces the
    kernel, so it happens once per shape, not once per call."""
    grid = (registration.lnc(),)
    key = (module, fn_name, grid, tuple(_static(a) for a in args))
    if key in BACKEND.failed:
        return _launch_failed(op, BACKEND.failed[key])
    try:
        launcher = BACKEND.launchers.get(key)
        if launcher is None:
            launcher = BACKEND.launcher(getattr(kernel_module(module), fn_name), grid)
            BACKEND.launchers[key] = launcher
        return launcher(*args)
    except KernelUnavailableError:
        raise
    except Exception as exc:  # noqa: BLE001 - any wrap/launch fault: say which, then decide
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        BACKEND.failed[key] = (
            f"{_call_text(module, fn_name, grid, args)} failed under "
            f"{registration.torch_neuronx_version()} ({detail[:300]})"
        )
        return _launch_failed(op, BACKEND.failed[key])


def _launch_failed(op: str, why: str) -> None:
    if mode(op) == "on":
        raise KernelUnavailableError(
            f"kernels.{op}: on, but {why}; set kernels.{op}: auto to fall back to PyTorch"
        )
    if (op, why) not in BACKEND.warned:
        BACKEND.warned.add((op, why))
        warnings.warn(
            f"trnf::{op}: {why}; using the PyTorch reference for this shape",
            KernelFallbackWarning,
            stacklevel=3,
        )
    return None


def kernel_importable(name: str) -> str | None:
    """None when the kernel file loads with the current loader, else why not."""
    try:
        kernel_module(name)
    except Exception as exc:  # noqa: BLE001 - any import failure means: no kernel here
        return f"{type(exc).__name__}: {exc}"
    return None


def wants_kernel(device_type: str) -> bool:
    return device_type in BACKEND.devices


def fallback(op: str, shape_text: str, reason: str) -> None:
    """Unsupported shape: raise when the recipe said ``on``, else warn once and carry on."""
    if mode(op) == "on":
        raise KernelUnavailableError(
            f"kernels.{op}: on, but the NKI kernel does not support {shape_text} ({reason}); "
            f"set kernels.{op}: auto to fall back to the PyTorch reference"
        )
    key = (op, shape_text)
    if key not in BACKEND.warned:
        BACKEND.warned.add(key)
        warnings.warn(
            f"trnf::{op}: {shape_text} unsupported by the NKI kernel ({reason}); using the PyTorch reference",
            KernelFallbackWarning,
            stacklevel=3,
        )


def _index_grid(kernel: Any, grid: tuple[int, ...]) -> Any:
    return kernel[grid]


def forget_launchers() -> None:
    """Drop every kept launcher and remembered launch failure (a new backend, a reset)."""
    BACKEND.launchers = {}
    BACKEND.failed = {}


@contextlib.contextmanager
def kernel_backend(
    loader: Callable[[str], Any],
    devices: set[str] | frozenset[str],
    launcher: Launcher = _index_grid,
) -> Iterator[None]:
    """Temporarily load kernels with ``loader`` and run them for tensors on ``devices``,
    launching each with ``launcher(kernel, (lnc,))`` (default ``kernel[(lnc,)]``)."""
    saved = (
        BACKEND.loader,
        BACKEND.devices,
        dict(BACKEND.modules),
        BACKEND.launcher,
        BACKEND.launchers,
        BACKEND.failed,
    )
    BACKEND.loader, BACKEND.devices, BACKEND.modules = loader, frozenset(devices), {}
    BACKEND.launcher = launcher
    forget_launchers()
    try:
        yield
    finally:
        (
            BACKEND.loader,
            BACKEND.devices,
            BACKEND.modules,
            BACKEND.launcher,
            BACKEND.launchers,
            BACKEND.failed,
        ) = saved


# ---------------------------------------------------------------- what each kernel supports
# Each returns None when the kernel handles the shapes, else the reason it does not.

FLOAT_DTYPES = ("torch.float32", "torch.bfloat16", "torch.float16")


def _dtype_ok(*dtypes: object) -> str | None:
    bad = [str(d) for d in dtypes if str(d) not in FLOAT_DTYPES]
    return f"dtype {bad[0]} (kernels take float32, bfloat16, float16)" if bad else None


def supports_relu2(shape: tuple[int, ...], dtype: object) -> str | None:
    if 0 in shape:
        return "empty tensor"
    return _dtype_ok(dtype)


def supports_rmsnorm(shape: tuple[int, ...], dtype: object) -> str | None:
    d = shape[-1] if shape else 0
    # x, dy, three float32 work rows and one output row resident per partition (backward)
    if d < 1 or d * (2 * 4 + 4 * 4) > SBUF_BYTES_PER_PARTITION * 3 // 4:
        return f"last dimension {d} does not fit one SBUF row tile"
    return _dtype_ok(dtype)


def supports_rope_qknorm(shape: tuple[int, ...], dtype: object, t_angles: int) -> str | None:
    if len(shape) != 4:
        return "x must be [B, H, T, D]"
    d = shape[-1]
    if d % 2:
        return f"head dim {d} is odd"
    if t_angles < shape[2]:
        return f"cos/sin cover {t_angles} positions < T={shape[2]}"
    # a work item holds g positions x all heads per partition (kernels/rope_qknorm.py,
    # GROUP_ELEMS): x, dy, out (float32 at most) and the backward's float32 work tiles
    # (z, dz, prod and the two half-tiles)
    per_position = shape[1] * d
    need = 8 * 4 * max(1, 4096 // per_position) * per_position
    if need > SBUF_BYTES_PER_PARTITION * 3 // 4:
        return f"{shape[1]} heads x {d} need {need} bytes of SBUF per partition"
    return _dtype_ok(dtype)


def supports_cross_entropy(shape: tuple[int, ...], dtype: object) -> str | None:
    if len(shape) != 2 or 0 in shape:
        return "logits must be a non-empty [N, V]"
    if shape[1] >= 1 << 24:
        return "vocabulary >= 2^24 (targets travel as float32)"
    return _dtype_ok(dtype)


def supports_attention(q: tuple[int, ...], k: tuple[int, ...], dtype: object) -> str | None:
    if len(q) != 4 or len(k) != 4:
        return "q, k, v must be [B, H, T, D]"
    if q[-1] > PMAX:
        return f"head dim {q[-1]} > {PMAX} (one matmul contraction)"
    if k[1] == 0 or q[1] % k[1] or q[0] != k[0] or q[2] != k[2] or q[3] != k[3]:
        return "k/v must be [B, Hkv, T, D] with Hkv dividing H"
    return _dtype_ok(dtype)


def polar_express_sbuf_bytes(m: int, n: int, itemsize: int) -> int:
    """Same formula as kernels/polar_express.py:sbuf_bytes (a test keeps them equal)."""
    mt, nt = -(-m // PMAX), -(-n // PMAX)
    resident = 2 * mt * n + 2 * nt * m + 2 * mt * m
    return resident * itemsize + 4 * (PMAX + 512 + 8) + 2 * itemsize * PMAX


def supports_polar_express(shape: tuple[int, ...], dtype: object, itemsize: int) -> str | None:
    if len(shape) < 2:
        return "needs a matrix"
    m, n = sorted(shape[-2:])
    need = polar_express_sbuf_bytes(m, n, itemsize)
    if need > SBUF_BYTES_PER_PARTITION:
        return f"{m}x{n} needs {need} bytes of SBUF per partition > {SBUF_BYTES_PER_PARTITION}"
    return _dtype_ok(dtype)
