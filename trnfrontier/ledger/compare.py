"""The library behind `trnf compare A B`: is B better than A, by how much, how sure.

Each side's score per run (``scores.primary_score``; all at one setting, or refused),
the mean and spread per side, the difference B - A with a confidence interval and a test
that fits the sample sizes (``stats.welch``), a plain verdict, how many more seeds per side
would resolve a difference of that size, and, where official scores were recorded, the
projected leaderboard score of each side. Lower val_bpb is better; ``metric="core"``
compares the runs' CORE scores (`trnf eval --core`) instead, where higher is better.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from trnfrontier import stats
from trnfrontier.errors import TrnfError
from trnfrontier.ledger import confound, official, scores
from trnfrontier.ledger.groups import Group

# A score further than this many robust spreads (1.4826 x MAD) from its side's median is
# pointed out: teams see occasional warm-up spikes of 10x the seed-to-seed spread.
OUTLIER_SPREADS = 4.0
# Above this many runs per side, "N more seeds would resolve it" is not advice.
MAX_USEFUL_SEEDS = 200


def _scored(
    group: Group, tokens: int | None, seq_len: int | None, metric: scores.Metric
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[str]]:
    """(run, score) pairs of a side, and the names of its runs that have no such score."""
    pairs, unscored = [], []
    for run in group.runs:
        score = metric.pick(run, tokens, seq_len)
        if score is None:
            unscored.append(run["name"])
        else:
            pairs.append((run, score))
    pairs.sort(key=lambda pair: (pair[0].get("seed") is None, pair[0].get("seed") or 0))
    return pairs, unscored


def check_comparable(pairs: list[tuple[dict[str, Any], dict[str, Any]]], metric: scores.Metric = scores.METRICS["val_bpb"]) -> None:
    """Refuse scores measured on different data, lengths, prepare.py or tokenizer (for
    CORE: bundle, subsample, crop or tokenizer)."""
    first_run, first = pairs[0]
    for run, score in pairs[1:]:
        field = scores.first_difference(first, score, metric.fields)
        if field is not None:
            raise TrnfError(
                f"refusing to compare: {first_run['name']} and {run['name']} were scored with different {field} "
                f"({metric.describe(first)} vs {metric.describe(score)}); {metric.rescore}"
            )


def _outliers(label: str, pairs: list[tuple[dict[str, Any], dict[str, Any]]], key: str) -> list[str]:
    values = [s[key] for _, s in pairs]
    if len(values) < 4:
        return []
    median = statistics.median(values)
    spread = 1.4826 * statistics.median(abs(v - median) for v in values)
    if spread == 0:
        return []
    return [
        f"{label}: {run['name']} (seed {run.get('seed')}) is {s[key] - median:+.5f} from the side's median, "
        f"{abs(s[key] - median) / spread:.0f} robust spreads: a warm-up spike? It is included"
        for run, s in pairs
        if abs(s[key] - median) > OUTLIER_SPREADS * spread
    ]


def _side(group: Group, pairs: list[tuple[dict[str, Any], dict[str, Any]]], unscored: list[str], key: str) -> dict[str, Any]:
    summary = stats.describe([s[key] for _, s in pairs])
    return {
        "label": group.label,
        "runs": [{"name": r["name"], "seed": r.get("seed"), key: s[key], "run_dir": r["run_dir"]} for r, s in pairs],
        "unscored": unscored,
        **asdict(summary),
    }


def pooled_sd(a: stats.Summary, b: stats.Summary) -> float | None:
    parts = [(s.sd, s.n) for s in (a, b) if s.sd is not None]
    if not parts:
        return None
    dof = sum(n - 1 for _, n in parts)
    return (sum(sd**2 * (n - 1) for sd, n in parts) / dof) ** 0.5


def compare(
    a: Group,
    b: Group,
    *,
    tokens: int | None = None,
    seq_len: int | None = None,
    confidence: float = 0.95,
    resolve: float | None = None,
    all_runs: list[dict[str, Any]] | None = None,
    unpaired: bool = False,
    metric: str = "val_bpb",
) -> dict[str, Any]:
    """The JSON document `trnf compare --json` prints (``verdict`` is the plain sentence)."""
    overlap = {r["run_dir"] for r in a.runs} & {r["run_dir"] for r in b.runs}
    if overlap:
        raise TrnfError(f"A and B share runs ({', '.join(sorted(overlap))}); they would be compared with themselves")
    measure = scores.METRICS[metric]
    pa, ua = _scored(a, tokens, seq_len, measure)
    pb, ub = _scored(b, tokens, seq_len, measure)
    for name, pairs, group in (("A", pa, a), ("B", pb, b)):
        if not pairs:
            wanted = "" if tokens is None and seq_len is None else " at that --tokens/--seq-len"
            how = "score runs with `trnf eval --core`" if metric == scores.CORE else "score runs with `trnf eval`"
            raise TrnfError(
                f"{name} ({group.label}) has no {metric} scores{wanted}; train some with `trnf compare A B --seeds N`, "
                f"or {how}"
            )
    check_comparable(pa + pb, measure)
    xa, xb = [s[metric] for _, s in pa], [s[metric] for _, s in pb]
    sa, sb = stats.describe(xa), stats.describe(xb)
    by_seed = not unpaired and seeds_pair(pa, pb)
    diff = stats.paired(xa, xb, confidence) if by_seed else stats.welch(xa, xb, confidence)
    spread = stats.describe([y - x for x, y in zip(xa, xb, strict=True)]).sd if by_seed else pooled_sd(sa, sb)
    document: dict[str, Any] = {
        "metric": metric,
        "higher_is_better": measure.higher_is_better,
        "a": _side(a, pa, ua, metric),
        "b": _side(b, pb, ub, metric),
        "setting": {name: pa[0][1].get(name) for name in measure.fields},
        "difference": asdict(diff),
        "confidence": confidence,
        "outliers": _outliers("A", pa, metric) + _outliers("B", pb, metric),
    }
    document.update(_verdict(diff, min(sa.n, sb.n), spread, confidence, resolve, measure.higher_is_better))
    _qualify(document, [r for r, _ in pa], [r for r, _ in pb])
    if metric == scores.CORE:  # no leaderboard CORE to project onto; no token count to caveat
        document["projection"] = {"available": False, "message": "no official CORE scores are recorded: no projection"}
        document["caveat"] = None
    else:
        document["projection"] = _projection(all_runs or [*a.runs, *b.runs], pa[0][1], sa, sb)
        document["caveat"] = _caveat(pa[0][1])
    return document


def _qualify(document: dict[str, Any], runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]]) -> None:
    """What else differs besides the change: step counts (a CONFOUNDED verdict) and the
    environment that changes speed (named in the message)."""
    steps = confound.confounded(runs_a, runs_b)
    environment = confound.environment_differences(runs_a, runs_b)
    document["confounded"] = steps
    document["environment_differences"] = environment
    if steps is not None:
        document["verdict"] = "confounded"
        document["message"] = f"{confound.confounded_line(steps)}. {document['message']}"
    if environment:
        document["message"] += f"; {confound.environment_line(environment)}"


# The leaderboard's evaluation length (prepare.EVAL_TOKENS_OFFICIAL; not imported: the
# contract module is loaded by path, and a kit's prepare.py may not define it).
OFFICIAL_TOKENS = 20_971_520


def _caveat(score: dict[str, Any]) -> str | None:
    """What the interval does not cover: it is seed-to-seed noise on the local evaluation
    data; a different, larger evaluation set can move two close configurations apart."""
    tokens = score.get("num_tokens")
    if not isinstance(tokens, int) or tokens >= OFFICIAL_TOKENS:
        return None
    return (
        f"the interval covers run-to-run noise on these {tokens:,} local evaluation tokens; the leaderboard "
        f"scores about {OFFICIAL_TOKENS:,} private ones, which can separate or reorder very close configurations"
    )


def fmt(value: float) -> str:
    """Differences of a few 1e-4 need five decimals; larger ones read better with four."""
    return f"{value:.5f}" if abs(value) < 0.001 else f"{value:.4f}"


def fmt_p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def seeds_pair(pa: list[tuple[dict[str, Any], dict[str, Any]]], pb: list[tuple[dict[str, Any], dict[str, Any]]]) -> bool:
    """True when both sides ran exactly the same seeds, each once, at least two: then each
    seed's B - A is one observation (whatever the seed decides, initialisation and sampling,
    is shared by both sides, so much of its luck cancels; where it is not shared the test
    is still valid, only less sharp). Decided from the seeds alone, never from the scores."""
    seeds_a, seeds_b = [r.get("seed") for r, _ in pa], [r.get("seed") for r, _ in pb]
    return (
        len(seeds_a) >= 2
        and None not in seeds_a
        and len(set(seeds_a)) == len(seeds_a)
        and seeds_a == seeds_b  # both sides are sorted by seed
    )


def _verdict(
    diff: stats.Difference, n: int, spread: float | None, confidence: float, resolve: float | None,
    higher_is_better: bool = False,
) -> dict[str, Any]:
    level = f"{100 * confidence:g}%"
    if diff.p_value is None or diff.half_width is None:
        return {
            "verdict": "unknown",
            "message": (
                f"B - A = {diff.difference:+.5f}, but one run per side says nothing about run-to-run noise: "
                "run at least 2 seeds per side (`--seeds 3`)"
            ),
            "seeds_to_resolve": None,
        }
    alpha = 1.0 - confidence
    size = f"{fmt(abs(diff.difference))} +- {fmt(diff.half_width)} ({level} CI), {fmt_p(diff.p_value)}"
    if diff.p_value < alpha:
        better = "B" if (diff.difference < 0) != higher_is_better else "A"
        return {"verdict": f"{better} better", "message": f"{better} better by {size}", "seeds_to_resolve": None}
    sd = spread or 0.0
    delta = resolve if resolve is not None else abs(diff.difference) or sd
    result: dict[str, Any] = {"verdict": "no significant difference", "resolve_delta": delta}
    needed = (
        stats.seeds_to_resolve(sd, delta, confidence, limit=MAX_USEFUL_SEEDS, paired=diff.method == "paired")
        if delta > 0
        else None
    )
    more = None if needed is None else max(0, needed - n)
    result["seeds_to_resolve"] = more
    head = f"no significant difference (B - A = {diff.difference:+.5f} +- {fmt(diff.half_width)}, {fmt_p(diff.p_value)})"
    if more is None:
        tail = f"a difference of {fmt(delta)} is below what seeds can resolve (over {MAX_USEFUL_SEEDS} per side)"
    else:
        tail = f"{more} more seeds per side would resolve {fmt(delta)} (80% power)"
    result["message"] = f"{head}; {tail}"
    return result


def _projection(
    runs: list[dict[str, Any]], score: dict[str, Any], sa: stats.Summary, sb: stats.Summary
) -> dict[str, Any]:
    fits = official.fit_offsets(runs)
    if not fits:
        return {"available": False, "message": official.no_pairs_line()}
    projected_a = official.project({**score, "val_bpb": sa.mean}, fits)
    projected_b = official.project({**score, "val_bpb": sb.mean}, fits)
    if projected_a is None or projected_b is None:
        return {
            "available": False,
            "message": f"official scores were recorded, but none at this setting ({scores.describe_setting(score)}): no projection",
        }
    fit = fits[(score.get("num_tokens"), score.get("seq_len"))]
    return {"available": True, "fit": fit.to_json(), "a": list(projected_a), "b": list(projected_b)}
