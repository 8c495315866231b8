"""The project's prepare.py and the stub organisers' prepare.py expose the same contract.

The stub (tests/fixtures/kit/prepare.py) has exactly the names of docs/kit-contract.md and no
public extra, so every flow the kit tests drive through it proves that trnf needs nothing
beyond that surface. Here: the names, the signatures (parameter names, order and kinds),
the constants, and that the project's extras are all optional.
"""

from __future__ import annotations
import __future__

import importlib.util
import inspect
from types import ModuleType

import pytest

from tests.kit.stub_kit import STUB_PREPARE
from trnfrontier.runtime import prepare_calls


@pytest.fixture(scope="module")
def stub() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stub_kit_prepare", STUB_PREPARE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _public(module: ModuleType) -> set[str]:
    """Public names defined by the module itself (not imported modules, not __future__ flags)."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, (ModuleType, __future__._Feature)):
            continue
        if getattr(value, "__module__", module.__name__) not in (module.__name__, None) and callable(value):
            continue  # imported from elsewhere (Path, ...)
        names.add(name)
    return names


def _shape(function) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


def test_the_stub_has_exactly_the_contract_surface(stub: ModuleType) -> None:
    public = _public(stub) | {n for n in prepare_calls.CONTRACT_NAMES if n.startswith("_") and hasattr(stub, n)}
    assert public == set(prepare_calls.CONTRACT_NAMES)


def test_the_project_prepare_has_every_contract_name(prepare_module: ModuleType) -> None:
    assert prepare_calls.missing_names(prepare_module) == []


@pytest.mark.parametrize("name", prepare_calls.CONTRACT_CONSTANTS)
def test_constants_agree(prepare_module: ModuleType, stub: ModuleType, name: str) -> None:
    assert getattr(prepare_module, name) == getattr(stub, name)


@pytest.mark.parametrize("name", [n for n in prepare_calls.CONTRACT_FUNCTIONS if n != "Tokenizer"])
def test_signatures_agree(prepare_module: ModuleType, stub: ModuleType, name: str) -> None:
    """Same parameter names, order and kinds; the project's extra parameters (make_dataloader's
    resume_state, rank, world_size) come after the contract's and all have defaults."""
    theirs, ours = _shape(getattr(stub, name)), _shape(getattr(prepare_module, name))
    assert ours[: len(theirs)] == theirs
    extra = list(inspect.signature(getattr(prepare_module, name)).parameters.values())[len(theirs):]
    assert all(p.default is not inspect.Parameter.empty or p.kind is inspect.Parameter.VAR_KEYWORD for p in extra)


@pytest.mark.parametrize("method", ["get_bos_token_id", "get_vocab_size", "encode", "decode"])
def test_tokenizer_methods_agree(prepare_module: ModuleType, stub: ModuleType, method: str) -> None:
    assert _shape(getattr(prepare_module.Tokenizer, method)) == _shape(getattr(stub.Tokenizer, method))


def test_bos_is_the_first_special_at_8188(stub: ModuleType, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NEURON_COMPETITION_R1_CACHE_DIR", str(tmp_path))
    tokenizer = stub.ensure_tokenizer()
    assert tokenizer.get_vocab_size() == 8192 and tokenizer.get_bos_token_id() == 8188
