"""What else differs between runs being compared, besides the change under test.

- Steps: on a time budget a faster configuration trains more steps. When two sides'
  step counts differ by more than ``STEPS_TOLERANCE`` the comparison is CONFOUNDED: the
  score difference mixes the idea with the training length (a team's protocol found that
  a slower run "losing" at equal wall-clock is no evidence against its idea).
- The environment that changes speed (``runtime.speed_env``: compiler flags, LNC, world
  size, host, compile cache, package versions): a difference is named in the verdict.
"""

from __future__ import annotations

import statistics
from typing import Any

from trnfrontier.runtime.speed_env import COMPARED, flat

STEPS_TOLERANCE = 0.10


def steps_differ(a: float, b: float) -> bool:
    """True when two step counts differ by more than the tolerance (of the larger)."""
    return max(a, b) > 0 and abs(a - b) / max(a, b) > STEPS_TOLERANCE


def confounded(runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sides' mean step counts when they differ by more than the tolerance, else None
    (also None when a side recorded no steps: nothing to say)."""
    steps_a = [float(r["steps"]) for r in runs_a if isinstance(r.get("steps"), (int, float))]
    steps_b = [float(r["steps"]) for r in runs_b if isinstance(r.get("steps"), (int, float))]
    if not steps_a or not steps_b:
        return None
    mean_a, mean_b = statistics.fmean(steps_a), statistics.fmean(steps_b)
    if not steps_differ(mean_a, mean_b):
        return None
    return {"steps_a": mean_a, "steps_b": mean_b, "relative": abs(mean_a - mean_b) / max(mean_a, mean_b)}


def confounded_line(found: dict[str, Any]) -> str:
    return (
        f"CONFOUNDED: A trained {found['steps_a']:,.0f} steps and B {found['steps_b']:,.0f} "
        f"({100 * found['relative']:.0f}% apart, over the {100 * STEPS_TOLERANCE:.0f}% that counts as equal): "
        "the difference mixes the change with how long each side trained; compare at equal steps "
        "(budget.max_steps) to judge the idea itself"
    )


def _values(runs: list[dict[str, Any]], key: str) -> set[str]:
    found = (flat(r.get("speed_env")).get(key) for r in runs if r.get("speed_env"))
    return {"unset" if value is None else str(value) for value in found}


def environment_differences(runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each speed-environment key whose values differ between the sides (runs that
    recorded no environment are left out: "not recorded" is not a difference)."""
    differences = []
    for key in COMPARED:
        in_a, in_b = _values(runs_a, key), _values(runs_b, key)
        if in_a and in_b and in_a != in_b:
            differences.append({"key": key, "a": sorted(in_a), "b": sorted(in_b)})
    return differences


def environment_line(differences: list[dict[str, Any]]) -> str:
    shown = "; ".join(f"{d['key']} {' / '.join(d['a'])} vs {' / '.join(d['b'])}" for d in differences)
    return f"the sides ran in different environments ({shown}): speed, and on a time budget the score, may differ for that reason"
