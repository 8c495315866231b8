"""Shared fixtures.

``prepare_module``: the project's prepare.py, loaded by path (registered as ``prepare``).
``sample_home``: the offline sample dataset, prepared once per test session.
``tiny_models``: models with known logits (zero, random, peeking).
``tinyshakespeare``: ../shared/data/tinyshakespeare.txt, skipped when absent.
``private_ledger`` (automatic): the run ledger of the session, in a temporary folder.
``restore_prepare_module``: a test that imports another prepare.py leaves ``prepare`` as it found it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# runtime.compile defaults to auto (on for CPU): a compile costs tiny test runs a minute or
# more each, so the suite (and every process it starts, which inherits this) runs eager.
# Tests of compilation itself set runtime.compile=true, which this does not touch.
os.environ["TRNF_COMPILE"] = "0"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def prepare_module() -> ModuleType:
    """The project's trusted prepare.py (not ``$TRNF_PREPARE``: tests pin the file they test)."""
    from trnfrontier.runtime.prepare_loader import load_prepare

    return load_prepare(REPO_ROOT / "prepare.py")


@pytest.fixture()
def restore_prepare_module() -> Iterator[None]:
    saved = sys.modules.get("prepare")
    yield
    if saved is None:
        sys.modules.pop("prepare", None)
    else:
        sys.modules["prepare"] = saved


@pytest.fixture(scope="session", autouse=True)
def private_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every `trnf train` / `trnf eval` a test runs records into the run ledger; keep that
    ledger in the session's temporary folder, not in the shared sample home or ~/.cache.
    A test that wants its own sets ``TRNF_LEDGER`` with ``monkeypatch.setenv``."""
    path = tmp_path_factory.mktemp("ledger") / "ledger.sqlite"
    saved = os.environ.get("TRNF_LEDGER")
    os.environ["TRNF_LEDGER"] = str(path)
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop("TRNF_LEDGER", None)
        else:
            os.environ["TRNF_LEDGER"] = saved


@pytest.fixture(scope="session")
def sample_home(tmp_path_factory: pytest.TempPathFactory, prepare_module: ModuleType) -> Iterator[Path]:
    """A TRNF_HOME holding the prepared ``sample`` dataset (built once per session, ~5 s).

    While the session runs, ``TRNF_HOME`` points at it and ``TRNF_DATASET=sample``, so
    ``prepare.ensure_tokenizer()``, ``make_dataloader`` and ``evaluate_bpb`` read it, in
    this process and in subprocesses that inherit the environment. The previous values
    are restored when the session ends. (Set directly rather than with ``monkeypatch``,
    which is function-scoped.) A test that wants another home should set ``TRNF_HOME``
    with its own ``monkeypatch.setenv``: that is undone after the test, back to this one.
    Treat the files as read-only: copy the folder before changing anything in it.
    """
    home = tmp_path_factory.mktemp("trnf_home")
    prepare_module.setup("sample", home=home)
    saved = {key: os.environ.get(key) for key in ("TRNF_HOME", "TRNF_DATASET")}
    os.environ["TRNF_HOME"] = str(home)
    os.environ["TRNF_DATASET"] = "sample"
    try:
        yield home
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture()
def tinyshakespeare() -> Path:
    """../shared/data/tinyshakespeare.txt, or skip when this checkout lacks it."""
    path = SHARED_DATA / "tinyshakespeare.txt"
    if not path.is_file():
        pytest.skip(f"{path} is absent (it ships beside the project, not in it)")
    return path


@pytest.fixture(scope="session")
def tiny_models():
    """Tiny models with known logits, for evaluate_bpb and causality tests.

    ``ZeroLogits(vocab, bias={id: value})``: the same logits row everywhere (zeros unless
    biased). ``RandomLogits(vocab, seed, peek=False)``: logits[t, j] = a[x_t] * b[j] + c[j],
    random and elementwise (a row's logits are bit-identical whatever the batch around it);
    ``peek=True`` reads x[t+1] instead, the textbook causality bug.
    """
    import types

    import torch
    from torch import nn

    class ZeroLogits(nn.Module):
        def __init__(self, vocab: int, bias: dict[int, float] | None = None) -> None:
            super().__init__()
            row = torch.zeros(vocab)
            for token, value in (bias or {}).items():
                row[token] = value
            self.register_buffer("row", row)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.row.expand(*x.shape, -1).clone()

    class RandomLogits(nn.Module):
        def __init__(self, vocab: int, seed: int = 0, peek: bool = False) -> None:
            super().__init__()
            generator = torch.Generator().manual_seed(seed)
            self.a = nn.Parameter(torch.randn(vocab, generator=generator))
            self.b = nn.Parameter(torch.randn(vocab, generator=generator) * 2)
            self.c = nn.Parameter(torch.randn(vocab, generator=generator))
            self.peek = peek

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            source = torch.roll(x, shifts=-1, dims=1) if self.peek else x
            return self.a[source].unsqueeze(-1) * self.b + self.c

    return types.SimpleNamespace(ZeroLogits=ZeroLogits, RandomLogits=RandomLogits)
