"""Every header field verify reads from a model server is type-checked where the frame is parsed
(``served._typed``): a frame train.py forged with fields of other types is a ServerError naming
the field, never a TypeError in the check that reads it."""

from __future__ import annotations

from typing import Any

import pytest

from trnfrontier.untrusted.served import ServerError, _typed

HONEST = {"ready": True, "prepare_changed": [], "hooks": ["a hook"], "training": [], "attempts": [], "filled": []}


def test_the_real_servers_messages_pass() -> None:
    assert _typed(dict(HONEST)) == HONEST
    assert _typed({"shape": [1, 2, 3], "shares_prefixes": False}) == {"shape": [1, 2, 3], "shares_prefixes": False}
    assert _typed({"error": "load_for_eval: boom"}) == {"error": "load_for_eval: boom"}


@pytest.mark.parametrize(("field", "value", "says"), [
    ("hooks", 5, "'hooks' as an integer"),
    ("hooks", "abc", "'hooks' as a string"),
    ("attempts", {"a": 1}, "'attempts' as an object"),
    ("training", [1, "x"], "'training' as a list holding int, str"),
    ("filled", None, "'filled' as null"),
    ("prepare_changed", [["nested"]], "'prepare_changed' as a list holding list"),
    ("ready", 1, "'ready' as an integer, not true or false"),
    ("shares_prefixes", "yes", "'shares_prefixes' as a string, not true or false"),
    ("error", {"why": "x"}, "'error' as an object, not a string"),
])
def test_a_field_of_another_type_is_refused_by_name(field: str, value: Any, says: str) -> None:
    with pytest.raises(ServerError, match="protocol violation") as caught:
        _typed({**HONEST, field: value})
    assert says in str(caught.value), str(caught.value)
