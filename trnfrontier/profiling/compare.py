"""Two recipes timed alternately in one process: a ratio survives the drift of a shared machine.

Absolute step times on a busy host move by tens of percent from minute to minute; two
recipes measured in turns see the same drift, so their ratio is steady. Each round
times a block of steps of A and of B, in ABBA order over consecutive rounds so that a
trend favours neither, and the report gives the median ratio with its min-max spread.
"""

from __future__ import annotations

import statistics
from typing import Any

from trnfrontier.profiling import measure


def compare(a: measure.Setup, b: measure.Setup, steps: int, warmup: int, rounds: int = 5) -> dict[str, Any]:
    """Throughput of B over A (>1: B trains more tokens per second), per round and overall."""
    measure.warm_up(a, warmup)
    measure.warm_up(b, warmup)
    rounds = max(1, min(rounds, steps))
    per_round = max(1, steps // rounds)
    seconds: dict[str, list[float]] = {"a": [], "b": []}
    ratios: list[float] = []
    for r in range(rounds):
        order = (("a", a), ("b", b)) if r % 2 == 0 else (("b", b), ("a", a))
        block: dict[str, float] = {}
        for key, setup in order:
            times = [measure.guarded(setup, lambda s=setup: measure.timed_plain_step(s)) for _ in range(per_round)]
            block[key] = statistics.median(times)
            seconds[key] += times
        ratios.append((b.tokens_per_step / block["b"]) / (a.tokens_per_step / block["a"]))

    def side(setup: measure.Setup, key: str) -> dict[str, Any]:
        step = statistics.median(seconds[key])
        return {
            "recipe": setup.recipe.name,
            "device": setup.spec.name,
            "params": setup.model.num_params(),
            "tokens_per_step": setup.tokens_per_step,
            "step_seconds": step,
            "tokens_per_second": setup.tokens_per_step / step,
            "flops_per_token": setup.model.flops_per_token(setup.seq_len),
            "data_source": setup.data_source,
        }

    return {
        "a": side(a, "a"),
        "b": side(b, "b"),
        "rounds": rounds,
        "steps_per_round": per_round,
        "warmup_steps": warmup,
        "ratio_tokens_per_second_b_over_a": statistics.median(ratios),
        "ratio_spread": [min(ratios), max(ratios)],
        "ratios": ratios,
    }
