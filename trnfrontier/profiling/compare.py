"""Two recipes timed alternately in one process: a ratio survives the drift of a shared machine.

Absolute step times on a busy host move by tens of percent from minute to minute; two
recipes measured in turns see the same drift, so their ratio is steady. Each round
times a block of steps of A and of B, in ABBA order over consecutive rounds so that a
trend favours neither. The verdict treats the rounds as paired samples: a t interval on the
log of the per-round ratios (``trnfrontier.stats``), back-transformed, so "B is faster" is
said only when the whole interval is above 1 and "no significant difference" when it
contains 1. MFU of each side is against one peak measured in the same run.
"""

from __future__ import annotations

import math
import statistics
from functools import partial
from typing import Any

from trnfrontier import stats
from trnfrontier.profiling import flops, measure
from trnfrontier.progress import Steps

CONFIDENCE = 0.95


def verdict(ratios: list[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """B/A throughput from per-round ratios: the geometric mean, its t interval, and in words
    whether the rounds show a difference at all."""
    logs = [math.log(r) for r in ratios]
    centre, half = stats.mean_interval(logs, confidence)
    ratio = math.exp(centre)
    if half is None:
        return {"ratio": ratio, "low": None, "high": None, "confidence": confidence, "significant": False,
                "text": f"B/A = {ratio:.3f} from one round: no interval, no verdict (use more --steps)"}
    low, high = math.exp(centre - half), math.exp(centre + half)
    interval = f"{ratio:.3f} ({confidence:.0%} interval {low:.3f}-{high:.3f}, {len(ratios)} rounds)"
    if low <= 1.0 <= high:
        text = f"no significant difference: B/A tokens/s = {interval}"
    elif low > 1.0:
        text = f"B is faster: B/A tokens/s = {interval}, {100 * (low - 1):.1f}-{100 * (high - 1):.1f}% more tokens/s"
    else:
        text = f"B is slower: B/A tokens/s = {interval}, {100 * (1 - high):.1f}-{100 * (1 - low):.1f}% fewer tokens/s"
    return {"ratio": ratio, "low": low, "high": high, "confidence": confidence,
            "significant": not (low <= 1.0 <= high), "text": text}  # fmt: skip


def compare_units(steps: int, warmup: int, rounds: int = 5) -> int:
    rounds = max(1, min(rounds, steps))
    return 2 * warmup + 2 * rounds * max(1, steps // rounds) + 1


def compare(a: measure.Setup, b: measure.Setup, steps: int, warmup: int, rounds: int = 5,
            progress: Steps | None = None) -> dict[str, Any]:
    """Throughput of B over A (>1: B trains more tokens per second), per round and overall."""
    bar = progress or Steps.none()
    bar.describe("warm-up of A and B")
    measure.warm_up(a, warmup, bar)
    measure.warm_up(b, warmup, bar)
    rounds = max(1, min(rounds, steps))
    per_round = max(1, steps // rounds)
    seconds: dict[str, list[float]] = {"a": [], "b": []}
    ratios: list[float] = []
    for r in range(rounds):
        bar.describe(f"round {r + 1} of {rounds} (A and B alternate)")
        order = (("a", a), ("b", b)) if r % 2 == 0 else (("b", b), ("a", a))
        block: dict[str, float] = {}
        for key, setup in order:
            times: list[float] = []
            for _ in range(per_round):
                times.append(measure.guarded(setup, partial(measure.timed_plain_step, setup)))
                bar.advance()
            block[key] = statistics.median(times)
            seconds[key] += times
        ratios.append((b.tokens_per_step / block["b"]) / (a.tokens_per_step / block["a"]))

    bar.describe("measuring the device peak")
    peak = flops.device_peak(a.spec.device, a.spec.dtype, a.recipe.runtime.lnc)
    bar.advance()

    def side(setup: measure.Setup, key: str) -> dict[str, Any]:
        step = statistics.median(seconds[key])
        fpt = setup.model.flops_per_token(setup.seq_len)
        return {
            "recipe": setup.recipe.name,
            "device": setup.spec.name,
            "params": setup.model.num_params(),
            "tokens_per_step": setup.tokens_per_step,
            "step_seconds": step,
            "tokens_per_second": setup.tokens_per_step / step,
            "flops_per_token": fpt,
            "mfu": flops.mfu(fpt, setup.tokens_per_step / step, peak),
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
        "verdict": verdict(ratios),
        "peak_tflops": peak.flops / 1e12 if peak.flops else None,
        "peak_source": peak.source,
    }
