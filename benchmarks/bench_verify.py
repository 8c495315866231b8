"""`trnf verify` cost on a large archive, against `sha256sum` of the same bytes in the same run.

    python benchmarks/bench_verify.py [--mb 300] [--repeats 2]

Builds a valid submission whose checkpoint totals about ``--mb`` megabytes (the same
weights as checkpoint/model.safetensors and checkpoint/final.pt, as `trnf package`
ships them), verifies it without reruns (extraction + hashing, manifest, pins, launch,
screen, checkpoint scan, budget, and the contract probe subprocess), and prints one JSON
document:

- ``time``: best-of-``--repeats`` seconds for verify and for ``sha256sum ARCHIVE`` (the
  floor: read and hash every byte once), with ``ratio = verify / sha256sum``;
  ``static_seconds`` is verify's time minus the contract probe (a fixed cost: a Python
  process importing torch and running a few forwards).
- ``memory``: peak RSS of the verifying process for the full archive and for one a
  quarter of its size, each in a fresh process; flat memory means these stay close.
  The probe's own peak (it holds the model, necessarily) is reported apart.

The archive's tiny train.py and builders come from tests/verify/verify_kit.py.

    python benchmarks/bench_verify.py --archive runs/demo/submission.tar --baseline-src DIR [--pins FILE] [--repeats 3]

times `trnf verify ARCHIVE` (a real one, such as the demo's) with this checkout against
the same command with the trnfrontier of ``DIR`` (for instance ``git archive`` of an older
commit unpacked there), alternating the two so that machine load hits both alike:
``ratio = ours / baseline`` (best of ``--repeats`` each).

    python benchmarks/bench_verify.py --rerun [--tokens 2097152] [--seq-len 1024] [--width 64] [--repeats 2] [--home DIR]

times ``--rerun-eval``'s scoring of a small honest archive three ways, alternating in rounds so
that load hits all three alike, each at the contract's batch size:

- ``after``: the rerun as verify runs it now (``rerun.confirm``: two sandboxed servers, check
  rows mixed into every call, then the identity and validation-text checks);
- ``before``: the earlier rerun (one sandboxed server, the trusted ``evaluate_bpb`` on its
  logits, nothing mixed in), servers' start included in both;
- ``plain``: the reference, the trusted ``evaluate_bpb`` of the same model in this process
  (one thread, as the servers have), the cost floor of scoring at all.

``ratio`` is after / plain and ``ratio_after_before`` after / before (best of each); the
``scoring_ratio_*`` leave the servers' start out (a fixed cost), with the spread of the
per-round ratios. The three scores (equal: mixing leaves the honest score alone), the check
rows' honest float noise and the load average before and after go into the JSON too. When
the dataset holds fewer public validation tokens than ``--tokens`` (the offline sample
corpus has about 48,000), every path scores what there is and the JSON adds each path's time
projected to ``--tokens`` (start + scoring seconds per token x tokens), labelled as such.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests" / "verify"))

# Runs in a fresh interpreter so that peak RSS belongs to one verify only.
_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from trnfrontier.verify import Options, verify_archive
import trnfrontier.verify.runner as runner
probe_seconds = []
original = runner._contract_check
def timed(*args, **kwargs):
    started = time.perf_counter()
    try:
        return original(*args, **kwargs)
    finally:
        probe_seconds.append(time.perf_counter() - started)
runner._contract_check = timed
started = time.perf_counter()
report = verify_archive(Path(sys.argv[1]), Options(pins_file=Path(sys.argv[2])))
elapsed = time.perf_counter() - started
print(json.dumps({
    "seconds": elapsed, "probe_seconds": sum(probe_seconds), "ok": report.ok,
    "failed": [c.name for c in report.checks if not c.ok],
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "probe_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
}))
"""


def width_for(megabytes: float) -> int:
    """Model width whose float32 weights, stored twice (safetensors + final.pt), total ~megabytes."""
    per_copy = megabytes * 1e6 / 2 / 4
    # params = 2 * 8192 * d + 4 * d * d  ->  solve for d
    d = (-2 * 8192 + ((2 * 8192) ** 2 + 16 * per_copy) ** 0.5) / 8
    return max(16, int(d))


def build(work: Path, megabytes: float) -> tuple[Path, Path]:
    from verify_kit import build_archive, good_meta, pins_file, tiny_state, train_source

    width = width_for(megabytes)
    state = tiny_state(n_embd=width)
    work.mkdir(parents=True)
    archive = build_archive(work, train_py=train_source(n_embd=width), state=state, meta=good_meta(state))
    return archive, pins_file(work)


def verify_once(archive: Path, pins: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(archive), str(pins)], check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def sha256sum_seconds(archive: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["sha256sum", str(archive)], check=True, capture_output=True)
    return time.perf_counter() - started


def cli_seconds(archive: Path, src: Path, pins: Path | None) -> tuple[float, int]:
    """Wall seconds of `python -m trnfrontier verify ARCHIVE --json` with ``src``'s trnfrontier first on the path
    (run from the archive's folder: `-m` puts the working directory before PYTHONPATH)."""
    env = dict(os.environ, PYTHONPATH=str(src))
    cmd = [sys.executable, "-m", "trnfrontier", "verify", str(archive.resolve()), "--json", *(["--pins", str(pins.resolve())] if pins else [])]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, env=env, cwd=archive.resolve().parent)
    return time.perf_counter() - started, done.returncode


def compare(archive: Path, baseline: Path, repeats: int, pins: Path | None) -> dict:
    ours, theirs = [], []
    for _ in range(repeats):  # alternate, so that load changes hit both sides alike
        ours.append(cli_seconds(archive, REPO_ROOT, pins))
        theirs.append(cli_seconds(archive, baseline, pins))
    best_ours, best_theirs = min(t for t, _ in ours), min(t for t, _ in theirs)
    return {
        "benchmark": "verify-vs-baseline",
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
        "archive": str(archive), "archive_mb": round(archive.stat().st_size / 1e6, 1),
        "exit_codes": {"ours": sorted({c for _, c in ours}), "baseline": sorted({c for _, c in theirs})},
        "time": {"unit": "s", "ours": round(best_ours, 2), "reference": round(best_theirs, 2),
                 "reference_is": f"trnf verify with the trnfrontier of {baseline}", "ratio": round(best_ours / best_theirs, 2),
                 "all_ours": [round(t, 2) for t, _ in ours], "all_reference": [round(t, 2) for t, _ in theirs]},
    }


# -- --rerun: the scored pass before and after the check rows ------------------------------------

def _dataset(home: Path | None, tmp: Path) -> None:
    """A prepared dataset for the trusted scorer: ``home``, or the offline sample corpus in ``tmp``."""
    from trnfrontier.runtime.prepare_loader import load_prepare

    if home is None:
        home = tmp / "home"
        load_prepare(REPO_ROOT / "prepare.py").setup("sample", home=home)
        os.environ["TRNF_DATASET"] = "sample"
    os.environ["TRNF_HOME"] = str(home)


def _rerun_setup(tmp: Path, tokens: int, seq_len: int, width: int) -> dict:
    """The archive's files (extracted, as verify's root), the trusted scorer, and the honest claim."""
    import types

    import torch
    from verify_kit import build_archive, good_meta, tiny_state, train_source

    from trnfrontier.untrusted import sandbox
    from trnfrontier.verify import runner

    state = tiny_state(n_embd=width)
    build_archive(tmp, train_py=train_source(n_embd=width), state=state, meta=good_meta(state))
    root = tmp / "submission.tar.src"
    module = types.ModuleType("bench_train")
    exec(compile(train_source(n_embd=width), "train.py", "exec"), module.__dict__)
    model = module.load_for_eval(str(root / "checkpoint" / "final.pt"), "cpu")
    trusted = runner._trusted_prepare()
    options = runner.Options(eval_tokens=tokens, eval_seq_len=seq_len, timeout=3600.0, sandboxed=sandbox.available().ok)
    torch.set_num_threads(1)  # as each server runs (OMP_NUM_THREADS=1)
    return {"root": root, "model": model, "trusted": trusted, "options": options, "tokenizer": trusted.scorer.tokenizer(),
            "settings": options.settings(trusted.module), "names": sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())}


def _plain(s: dict) -> dict:
    import torch

    started = time.perf_counter()
    with torch.no_grad():
        result = s["trusted"].scorer.evaluate(lambda x: s["model"](x), s["tokenizer"], seq_len=s["settings"].seq_len,
                                              tokens=s["settings"].tokens, batch_size=s["settings"].batch_size)
    s["scored_tokens"] = int(result["num_tokens"])  # at most what the dataset's public validation split holds
    return {"start": 0.0, "total": time.perf_counter() - started, "bpb": float(result["val_bpb"])}


def _timed_servers(s: dict, tmp: Path, count: int, starts: list[float]):  # noqa: ANN202 - a context manager
    """``count`` sandboxed servers as verify starts them, the seconds their start took appended to ``starts``."""
    from trnfrontier.verify import runner
    from trnfrontier.verify.rerun import closing_all

    started = time.perf_counter()
    servers = runner._serve(s["root"], s["trusted"], s["options"], Path(tempfile.mkdtemp(dir=tmp)) / "scratch", "rerun-eval", count)
    starts.append(time.perf_counter() - started)
    return closing_all(servers)


def _before(s: dict, tmp: Path) -> dict:
    """The earlier rerun: one server, the trusted evaluate_bpb on its logits, nothing mixed in."""
    starts: list[float] = []
    started = time.perf_counter()
    with _timed_servers(s, tmp, 1, starts) as (served,):
        result = s["trusted"].scorer.evaluate(served, s["tokenizer"], seq_len=s["settings"].seq_len,
                                              tokens=s["settings"].tokens, batch_size=s["settings"].batch_size)
    return {"start": starts[0], "total": time.perf_counter() - started, "bpb": float(result["val_bpb"])}


def _after(s: dict, tmp: Path, claim_bpb: float) -> dict:
    """``rerun.confirm`` as verify calls it; the score and the check rows' evidence read back from its line."""
    from trnfrontier.verify.claims import Claim
    from trnfrontier.verify.rerun import confirm

    settings, starts = s["settings"], []
    started = time.perf_counter()
    done = confirm(Claim(claim_bpb, settings.tokens, settings.seq_len, "public_val"), settings, s["trusted"].scorer, s["tokenizer"],
                   lambda: _timed_servers(s, tmp, 2, starts), checkpoint=s["root"] / "checkpoint" / "model.safetensors",
                   root=s["root"], names=s["names"])
    total = time.perf_counter() - started
    if not done.ok:
        raise SystemExit(f"the honest archive was not confirmed: {done.line}")
    evidence = next(part for part in done.line.split("; ") if "check rows inside the scored pass" in part)
    return {"start": starts[0], "total": total, "bpb": float(done.line.split(" gives ", 1)[1].split(",", 1)[0]), "evidence": evidence}


def _spread(values: list[float]) -> dict:
    return {"min": round(min(values), 3), "max": round(max(values), 3)}


def _summary(rounds: list[dict], scored: int, public: int) -> dict:
    """Best of each path; ratios of the whole and of the scoring alone (server start apart), with their spread;
    the time at the public token count projected from the scoring's per-token cost when fewer were scored."""
    def scoring(r: dict, k: str) -> float:
        return r[k]["total"] - r[k]["start"]

    paths = ("plain", "before", "after")
    best = {k: min(rounds, key=lambda r, k=k: r[k]["total"])[k] for k in paths}
    scoring_best = {k: min(scoring(r, k) for r in rounds) for k in paths}
    out: dict = {"unit": "s", "ours": round(best["after"]["total"], 2), "reference": round(best["plain"]["total"], 2),
                 "reference_is": "the trusted evaluate_bpb of the same model in this process, one thread (no server start)",
                 "before": round(best["before"]["total"], 2),
                 "server_start": {k: round(best[k]["start"], 2) for k in ("before", "after")},
                 "scoring": {k: round(v, 2) for k, v in scoring_best.items()},
                 "ratio": round(best["after"]["total"] / best["plain"]["total"], 2),
                 "ratio_after_before": round(best["after"]["total"] / best["before"]["total"], 2),
                 "scoring_ratio_after_before": round(scoring_best["after"] / scoring_best["before"], 2),
                 "scoring_ratio_after_plain": round(scoring_best["after"] / scoring_best["plain"], 2),
                 "spread_scoring_ratio_after_before": _spread([scoring(r, "after") / scoring(r, "before") for r in rounds]),
                 "spread_scoring_ratio_after_plain": _spread([scoring(r, "after") / scoring(r, "plain") for r in rounds]),
                 "all": [{k: [round(r[k]["start"], 2), round(r[k]["total"], 2)] for k in paths} for r in rounds]}
    if scored < public:
        out["projected_to_public_tokens"] = {
            "tokens": public, "how": "server start + best scoring seconds x public tokens / tokens scored",
            **{k: round(best[k]["start"] + scoring_best[k] * public / scored, 1) for k in paths}}
    return out


def rerun_bench(tokens: int, seq_len: int, width: int, repeats: int, home: Path | None) -> dict:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-rerun-") as name:
        tmp = Path(name)
        _dataset(home, tmp)
        s = _rerun_setup(tmp, tokens, seq_len, width)
        rounds = []
        for _ in range(repeats):  # alternate, so that load changes hit all three alike
            plain = _plain(s)
            rounds.append({"plain": plain, "before": _before(s, tmp), "after": _after(s, tmp, plain["bpb"])})
    last = rounds[-1]
    return {
        "benchmark": "verify-rerun",
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "settings": {"tokens": s["settings"].tokens, "seq_len": s["settings"].seq_len, "batch_size": s["settings"].batch_size,
                     "scored_tokens": s["scored_tokens"], "model_width": width, "sandboxed": s["options"].sandboxed,
                     "dataset": os.environ.get("TRNF_DATASET", "")},
        "val_bpb": {k: last[k]["bpb"] for k in ("plain", "before", "after")},
        "evidence": last["after"]["evidence"],
        "time": _summary(rounds, s["scored_tokens"], tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=300.0, help="checkpoint megabytes in the archive (both copies)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--archive", type=Path, help="time verify on this archive instead of a generated one")
    parser.add_argument("--baseline-src", type=Path, help="with --archive: a directory holding the trnfrontier to compare with")
    parser.add_argument("--pins", type=Path, help="with --archive: the pins file both sides verify against")
    parser.add_argument("--rerun", action="store_true", help="time --rerun-eval's scoring: after (check rows), before, plain")
    parser.add_argument("--tokens", type=int, default=2_097_152, help="with --rerun: tokens scored (the public count)")
    parser.add_argument("--seq-len", type=int, default=1024, help="with --rerun: evaluation length")
    parser.add_argument("--width", type=int, default=64, help="with --rerun: the small model's width")
    parser.add_argument("--home", type=Path, help="with --rerun: a TRNF_HOME with a prepared dataset (default: the sample corpus, built)")
    args = parser.parse_args()
    if args.rerun:
        print(json.dumps(rerun_bench(args.tokens, args.seq_len, args.width, args.repeats, args.home), indent=2))
        return
    if args.archive is not None:
        if args.baseline_src is None:
            parser.error("--archive needs --baseline-src")
        print(json.dumps(compare(args.archive, args.baseline_src, args.repeats, args.pins), indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        big, big_pins = build(Path(tmp) / "big", args.mb)
        small, small_pins = build(Path(tmp) / "small", args.mb / 4)
        sha256sum_seconds(big)  # warm the page cache for both sides alike
        runs = [verify_once(big, big_pins) for _ in range(args.repeats)]
        sha = min(sha256sum_seconds(big) for _ in range(args.repeats))
        best = min(runs, key=lambda r: r["seconds"])
        small_run = verify_once(small, small_pins)
        result = {
            "benchmark": "verify",
            "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
            "archive_mb": round(big.stat().st_size / 1e6, 1),
            "verify_ok": best["ok"], "failed_checks": best["failed"],
            "time": {
                "unit": "s", "ours": round(best["seconds"], 3), "reference": round(sha, 3),
                "reference_is": "sha256sum of the same archive (page cache warm)",
                "ratio": round(best["seconds"] / sha, 2),
                "static_seconds": round(best["seconds"] - best["probe_seconds"], 3),
                "static_ratio": round((best["seconds"] - best["probe_seconds"]) / sha, 2),
                "contract_probe_seconds": round(best["probe_seconds"], 3),
            },
            "memory": {
                "unit": "MB", "peak_rss_full": round(best["peak_rss_mb"], 1),
                "peak_rss_quarter": round(small_run["peak_rss_mb"], 1),
                "quarter_archive_mb": round(small.stat().st_size / 1e6, 1),
                "growth_per_archive_mb": round((best["peak_rss_mb"] - small_run["peak_rss_mb"]) / max(1e-9, (big.stat().st_size - small.stat().st_size) / 1e6), 3),
                "probe_peak_rss_full": round(best["probe_peak_rss_mb"], 1),
            },
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
