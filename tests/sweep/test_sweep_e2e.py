"""`trnf sweep` end to end on a real embedded Ray with tiny CPU runs (slow: three sweeps, about
four minutes on 2 cores). Each sweep runs in a `trnf` process of its own, as a user runs
it, and one sweep serves several assertions.

- ASHA: a 4-trial grid, 2 at a time; two trials with a learning rate far too high are
  stopped at their first report, the two others (identical training, so their losses tie
  and neither can cut the other) complete; the ledger has every trial with its sweep id.
- Faults: a trial whose dataset does not exist fails with its error line and the sweep
  goes on; `kill -9` of the driver mid-sweep leaves no trial process behind, and
  `--resume` finishes: the completed trial is not trained again, the interrupted one
  continues from its checkpoint.
- Kit: two trials of the stub kit's train.py at once, each writing its checkpoint into its
  own run directory through NEURON_COMPETITION_R1_OUT_DIR, each scored by `trnf eval`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("ray.tune", reason="the sweep extra (ray[tune]) is not installed")

from tests.kit.stub_kit import copy_kit, make_kit_cache  # noqa: E402 - after the skip, as the module needs Ray

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model.depth=1", "model.n_embd=64", "model.head_dim=32", "model.n_kv_head=1", "model.sequence_len=32",
    "data.batch_size=4", "runtime.threads=1", "eval.tokens=2048", "eval.seq_len=32", "eval.batch_size=8",
    "budget.startup_steps_excluded=1", "run.log_every_steps=1", "schedule.warmup_steps=0",
]  # fmt: skip


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TRNF_PREPARE": str(REPO / "prepare.py"), "TRNF_LEDGER": str(tmp_path / "ledger.sqlite")}


def _trnf(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trnfrontier", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


def _write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return path


@pytest.mark.slow
def test_asha_stops_the_bad_trials_and_every_trial_is_in_the_ledger(sample_home: Path, tmp_path: Path) -> None:
    spec = _write_spec(tmp_path / "asha.yaml", {
        "name": "asha", "recipe": "cpu_smoke",
        # run.max_loss raised: a too-high learning rate makes a bad run, not a diverged one.
        "overrides": [*TINY, "budget.max_steps=40", "run.checkpoint_every_seconds=null", "run.max_loss=1000"],
        "space": {"optim.embedding_lr": {"grid": [0.3, 50.0]}, "eval.tokens": {"grid": [2048, 1024]}},
        "concurrency": 2, "resources": {"cpu": 1},
        "early_stop": {"reports": 4, "grace_period": 0.25, "reduction_factor": 2},
    })  # fmt: skip
    env = _env(tmp_path)
    done = _trnf(["sweep", str(spec), "--out", str(tmp_path / "sw"), "--json"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(r["params"]["optim.embedding_lr"], r["params"]["eval.tokens"]): r for r in json.loads(done.stdout)["trials"]}
    assert len(rows) == 4
    for tokens in (2048, 1024):
        good, bad = rows[(0.3, tokens)], rows[(50.0, tokens)]
        assert good["status"] == "completed" and good["val_bpb"] > 0 and good["steps"] == 40
        assert bad["status"] == "stopped" and bad["val_bpb"] is None
        assert bad["fraction"] < 1.0 and bad["train_loss"] > good["train_loss"]
    assert "trials: 0 running, 2 done, 2 stopped, 0 failed, 0 pending" in done.stderr
    assert (tmp_path / "sw" / "best_recipe.yaml").is_file() and (tmp_path / "sw" / "sweep.png").is_file()

    ledger = json.loads(_trnf(["runs", "--json"], tmp_path, env).stdout)["runs"]
    sweep_id = json.loads((tmp_path / "sw" / "sweep.json").read_text())["id"]
    trials = [r for r in ledger if r["sweep"] == sweep_id]
    assert len(trials) == 4
    assert {(r["sweep_params"]["optim.embedding_lr"], r["sweep_params"]["eval.tokens"]) for r in trials} == set(rows)
    assert all(r["speed_env"]["world_size"] == 1 for r in trials if r["status"] == "completed")
    stopped = [r for r in trials if r["sweep_params"]["optim.embedding_lr"] == 50.0]
    assert {r["status"] for r in stopped} == {"interrupted"}  # the run's own record says who stopped it
    assert all("stopped early by the sweep's ASHA" in _summary(Path(r["run_dir"]))["error"] for r in stopped)

    status = _trnf(["sweep", "status", str(tmp_path / "sw")], tmp_path, env)
    assert status.returncode == 0 and "ASHA stopped it at 25%" in status.stdout


def _wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _summary(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _trial_dirs(folder: Path) -> dict[int, Path]:
    """Trial run directories by their max_steps (the swept key)."""
    found = {}
    for run_dir in folder.glob("faults-*"):
        recipe = json.loads((run_dir / "recipe.json").read_text()) if (run_dir / "recipe.json").is_file() else None
        if recipe is not None:
            found[recipe["budget"]["max_steps"]] = run_dir
    return found


def _trainers_of(folder: Path) -> list[int]:
    """Live processes whose command line names the sweep folder (trnf train, its trainer)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(folder) in cmdline and "trnfrontier" in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.mark.slow
def test_a_failing_trial_and_kill_9_then_resume(sample_home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "faults"
    spec = _write_spec(tmp_path / "faults.yaml", {
        "name": "faults", "recipe": "cpu_smoke",
        "overrides": [*TINY, "run.checkpoint_every_seconds=1"],
        # A short trial, a long one (killed half-way), and each of them again on a dataset
        # that does not exist: those fail at once, with trnf train's own error line.
        "space": {"budget.max_steps": {"grid": [6, 150]}, "data.dataset": {"grid": ["sample", "no_such_dataset"]}},
        "concurrency": 2, "resources": {"cpu": 1},
    })  # fmt: skip
    env = _env(tmp_path)
    driver = subprocess.Popen([sys.executable, "-m", "trnfrontier", "sweep", str(spec), "--out", str(folder)],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        def short_done_long_checkpointed() -> bool:
            dirs = _trial_dirs(folder)
            short, long = dirs.get(6), dirs.get(150)
            return bool(short and long and _summary(short).get("status") == "completed"
                        and list((long / "checkpoints").glob("step_*")) and not _summary(long))  # fmt: skip

        _wait_for(short_done_long_checkpointed, 300, "the short trial to finish and the long one to checkpoint")
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        _wait_for(lambda: not _trainers_of(folder), 60, "every trial process to end with the driver")
    finally:
        if driver.poll() is None:
            driver.kill()
    short, long = _trial_dirs(folder)[6], _trial_dirs(folder)[150]
    short_summary_time = (short / "summary.json").stat().st_mtime_ns
    # It ended with the driver (Ray ends a worker's processes with it), its checkpoints kept.
    assert _summary(long).get("status") != "completed" and list((long / "checkpoints").glob("step_*"))

    resumed = _trnf(["sweep", "--resume", str(folder), "--json"], tmp_path, env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = {(r["params"]["budget.max_steps"], r["params"]["data.dataset"]): r for r in json.loads(resumed.stdout)["trials"]}
    assert len(rows) == 4
    assert rows[(6, "sample")]["status"] == "completed" and rows[(150, "sample")]["status"] == "completed"
    for steps in (6, 150):
        failed = rows[(steps, "no_such_dataset")]
        assert failed["status"] == "failed" and "no prepared dataset" in failed["error"]
    # Not repeated: the short trial's summary is the one it wrote before the kill, and it was launched once.
    assert (short / "summary.json").stat().st_mtime_ns == short_summary_time
    launches = (folder / "logs" / f"{short.name}.log").read_text().count("$ ")
    assert launches == 1
    # Resumed, not restarted: from the checkpoint it had, to the end.
    summary = _summary(long)
    assert summary["status"] == "completed" and summary["steps"] == 150 and summary["resumed_from"]
    assert "--resume" in (folder / "logs" / f"{long.name}.log").read_text()
    assert json.loads((folder / "sweep.json").read_text())["resumes"] == 1
    # `trnf sweep status`: the live view's counts line, and each failed trial's own error line.
    status = _trnf(["sweep", "status", str(folder), "--json"], tmp_path, env)
    shown = json.loads(status.stdout)
    assert shown["progress"].startswith("trials: 0 running, 2 done, 0 stopped, 2 failed, 0 pending; best val_bpb ")
    assert all("no prepared dataset" in r["error"] for r in shown["trials"] if r["status"] == "failed")


@pytest.mark.slow
def test_kit_trials_run_at_once_each_into_its_own_run_directory(prepare_module: Any, tmp_path: Path) -> None:
    team = copy_kit(tmp_path / "team")
    spec = _write_spec(tmp_path / "kit.yaml", {
        "name": "kit", "train_py": str(team / "train.py"),
        "space": {"--num-steps": {"grid": [6, 7]}}, "concurrency": 2, "resources": {"cpu": 1},
    })  # fmt: skip
    env = {k: v for k, v in _env(tmp_path).items() if not k.startswith("NEURON_COMPETITION_R1_")}
    env.update({
        "TRNF_PREPARE": str(team / "prepare.py"), "OMP_NUM_THREADS": "1",
        "NEURON_COMPETITION_R1_CACHE_DIR": str(make_kit_cache(tmp_path / "cache", prepare_module)),
        # No in-process eval; the sweep's own `trnf eval` scores this many tokens.
        "NEURON_COMPETITION_R1_EVAL_PUBLIC": "0", "NEURON_COMPETITION_R1_EVAL_TOKENS": "2048",
    })  # fmt: skip
    done = _trnf(["sweep", str(spec), "--out", str(tmp_path / "sw"), "--json"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout)["trials"]
    assert sorted(r["params"]["--num-steps"] for r in rows) == [6, 7]
    for row in rows:
        assert row["status"] == "completed" and row["val_bpb"] > 0 and row["steps"] == row["params"]["--num-steps"]
        run_dir = Path(row["run_dir"])
        summary = _summary(run_dir)
        assert summary["final_checkpoint"] == str(run_dir / "out" / "final.pt") and summary["out_dir_ignored"] is False
        [score] = [json.loads(line) for line in (run_dir / "scores.jsonl").read_text().splitlines()]
        # Scored over the run's EVAL_TOKENS (a whole batch of them, at least), not the public 2,097,152.
        assert score["val_bpb"] == row["val_bpb"] and 2048 <= score["num_tokens"] < 2_097_152
    assert not (team / "out").exists()  # nothing written beside the script
