"""Recipe-mode and kit-mode options, declared once for `trnf train` and `trnf package`."""

from __future__ import annotations

import pytest

from trnfrontier.cli import modes
from trnfrontier.errors import UsageError


@pytest.mark.parametrize("rules", [modes.TRAIN, modes.PACKAGE], ids=["train", "package"])
def test_an_option_of_the_other_mode_is_refused_naming_it(rules: tuple[modes.OnlyIn, ...]) -> None:
    for rule in rules:
        other: modes.Mode = "kit" if rule.mode == "recipe" else "recipe"
        with pytest.raises(UsageError) as refused:
            modes.check_mode(rules, other, {rule.option: True})
        assert rule.option in str(refused.value) and refused.value.exit_code == 2
        modes.check_mode(rules, rule.mode, {rule.option: True})  # its own mode takes it
