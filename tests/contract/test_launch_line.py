"""contract/launch.py: the launch line's grammar, and launch_line writing exactly what it accepts."""

from __future__ import annotations

import pytest

from trnfrontier.contract.launch import (
    LNC_CHOICES,
    NPROC_CHOICES,
    Launch,
    LaunchError,
    launch_line,
    parse_launch,
)


@pytest.mark.parametrize("lnc,nproc", [(1, 1), (1, 8), (2, 4), (2, 1)])
def test_launch_valid_shapes(lnc: int, nproc: int) -> None:
    line = f"NEURON_LOGICAL_NC_CONFIG={lnc} torchrun --standalone --nproc_per_node={nproc} train.py\n"
    assert parse_launch(line) == parse_launch(line.strip())
    assert (parse_launch(line).lnc, parse_launch(line).nproc) == (lnc, nproc)


def test_launch_line_is_the_grammar() -> None:
    """launch_line (what package, init and kit runs write) for exactly the choices parse_launch accepts."""
    assert launch_line(4, 2) == "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 train.py"
    for lnc in range(0, 4):
        for nproc in range(0, 10):
            if lnc in LNC_CHOICES and nproc in NPROC_CHOICES:
                assert parse_launch(launch_line(nproc, lnc)) == Launch(lnc=lnc, nproc=nproc)
            else:
                with pytest.raises(LaunchError):
                    parse_launch(launch_line(nproc, lnc))


@pytest.mark.parametrize("line", [
    "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 train.py && echo hi",
    "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 `id`",
    "NEURON_LOGICAL_NC_CONFIG=2 torchrun --nproc_per_node=4 train.py",
    "NEURON_LOGICAL_NC_CONFIG=2 python train.py",
    "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 other.py",
    "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 train.py\nrm -rf /",
    "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 train.py # comment",
    "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 'train.py'",
    "",
])
def test_launch_refusals(line: str) -> None:
    with pytest.raises(LaunchError):
        parse_launch(line)
