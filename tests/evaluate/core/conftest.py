"""Fixtures of the CORE tests: the shipped tokenizer, the format sample and small models."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from core_helpers import random_gpt


@pytest.fixture(scope="session")
def tokenizer(prepare_module: ModuleType) -> Any:
    """The tokenizer prepare.py ships (no prepared dataset needed)."""
    data, _sha = prepare_module.read_tokenizer_artifact()
    return prepare_module.Tokenizer.from_pickle_bytes(data)


@pytest.fixture(scope="session")
def sample_bundle(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The shipped format sample, unpacked into a session data home."""
    import os

    from trnfrontier.evaluate.core import fetch

    home = tmp_path_factory.mktemp("core_home")
    saved = os.environ.get("TRNF_HOME")
    os.environ["TRNF_HOME"] = str(home)
    try:
        return fetch.resolve(fetch.SAMPLE)
    finally:
        if saved is None:
            os.environ.pop("TRNF_HOME", None)
        else:
            os.environ["TRNF_HOME"] = saved


@pytest.fixture(scope="session")
def gpt() -> torch.nn.Module:
    return random_gpt()
