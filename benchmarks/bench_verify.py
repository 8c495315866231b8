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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=300.0, help="checkpoint megabytes in the archive (both copies)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--archive", type=Path, help="time verify on this archive instead of a generated one")
    parser.add_argument("--baseline-src", type=Path, help="with --archive: a directory holding the trnfrontier to compare with")
    parser.add_argument("--pins", type=Path, help="with --archive: the pins file both sides verify against")
    args = parser.parse_args()
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
