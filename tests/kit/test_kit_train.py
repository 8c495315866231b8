"""`trnf train --train-py` end to end on CPU: kit-style train.py fixtures under torchrun.

Each launch starts torchrun and its ranks (tens of seconds on a loaded machine), so the
runs are marked slow; the bad-input checks before launch are not.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kit_fixtures import pid_alive, run_cli, write_train_py

RUN_TIMEOUT = ["--timeout", "600"]


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("trnf: error:")]


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def two_rank_run(sample_home: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """The good fixture trained with 2 ranks through the real command line (shared by the checks below)."""
    root = tmp_path_factory.mktemp("kit2")
    train_py = write_train_py(root / "team", "good")
    run_dir = root / "runs" / "two"
    result = subprocess.run(
        [sys.executable, "-m", "trnfrontier", "train", "--train-py", str(train_py), "--nproc", "2", "--out", str(run_dir), *RUN_TIMEOUT],
        capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"},
    )
    return train_py, run_dir, result


# ---------------------------------------------------------------------------- before launch


@pytest.mark.parametrize("case", ["missing", "syntax", "no_load_for_eval"])
def test_bad_train_py_is_one_line_and_nothing_launches(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = tmp_path / "train.py"
    if case == "syntax":
        train_py.write_text("def load_for_eval(p, d):\n    return None\nif True\n")
    elif case == "no_load_for_eval":
        train_py.write_text("print('training')\n")
    run_dir = tmp_path / "runs" / "x"
    code, _, err = run_cli(["train", "--train-py", str(train_py), "--out", str(run_dir)], capsys)
    assert code != 0
    [line] = error_lines(err)
    assert {"missing": "no such file", "syntax": "train.py:3: syntax error", "no_load_for_eval": "defines no load_for_eval"}[case] in line
    assert not run_dir.exists()


def test_steps_without_dry_run_and_bad_lnc_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = write_train_py(tmp_path, "good")
    code, _, err = run_cli(["train", "--train-py", str(train_py), "--steps", "3"], capsys)
    assert code == 2 and "--steps limits a --dry-run" in err
    code, _, err = run_cli(["train", "--train-py", str(train_py), "--lnc", "3"], capsys)
    assert code == 2 and "NEURON_LOGICAL_NC_CONFIG is 1 or 2" in err


# ---------------------------------------------------------------------------- runs


@pytest.mark.slow
def test_two_ranks_write_the_run_directory(two_rank_run: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    train_py, run_dir, result = two_rank_run
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(run_dir)
    assert summary["status"] == "completed" and summary["problems"] == []
    assert summary["mode"] == "kit" and summary["world_size"] == 2 and summary["steps"] == 8
    assert summary["speed_env"]["world_size"] == 2 and summary["speed_env"]["lnc"] == 2  # what changes speed
    assert json.loads((run_dir / "provenance.json").read_text())["recipe_ref"] == str(train_py.resolve())  # in the ledger
    assert summary["accounting"] == "prepare.budget_accounting"
    assert summary["over_budget"] is False and summary["charged_seconds"] >= 0
    assert summary["headroom_seconds"] == pytest.approx(summary["budget_seconds"] - summary["charged_seconds"])
    assert summary["params"] == 2 * 8192 * 16 + 16 * 16
    # This script writes out/final.pt beside itself whatever NEURON_COMPETITION_R1_OUT_DIR says:
    # found there all the same, and noted (two runs of it at once would collide).
    assert summary["final_checkpoint"] == str(train_py.parent / "out" / "final.pt")
    assert summary["out_dir"] == str(run_dir / "out") and summary["out_dir_ignored"] is True
    assert "note: train.py ignores NEURON_COMPETITION_R1_OUT_DIR" in " ".join(result.stderr.split())
    assert summary["reported_val_bpb"] > 0 and summary["val_bpb"] is None  # the trusted score is trnf eval's
    assert {"tokens_per_second", "mfu", "device", "metrics.tokens_per_second"} <= set(summary["missing_fields"])
    assert "final_loss" not in summary["missing_fields"]
    launch = (run_dir / "launch.txt").read_text().strip()
    assert launch == "NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=2 train.py"
    recorded = json.loads((run_dir / "launch.json").read_text())
    assert recorded["argv"][1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert recorded["cwd"] == str(train_py.parent) and recorded["env"]["TRNF_STEP_LOG"] == str(run_dir / "step_boundaries.jsonl")
    assert recorded["env"]["NEURON_COMPETITION_R1_OUT_DIR"] == str(run_dir / "out") and recorded["out_dir_chosen_by"] == "trnf"
    assert (run_dir / "contract" / "prepare.py").read_bytes() == (Path(__file__).resolve().parents[2] / "prepare.py").read_bytes()
    for rank in (0, 1):  # every rank printed its own steps into its own log
        assert "step 7 | loss" in (run_dir / "logs" / f"rank{rank}.stdout.log").read_text()  # 0-based, as the kit
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(8))
    assert all("loss" in m and "charged_seconds" in m for m in metrics)
    assert metrics[-1]["charged_seconds"] == pytest.approx(summary["charged_seconds"])
    assert "step 7 | loss" in result.stderr  # live progress
    assert "trnf eval --train-py" in result.stderr
    # The write-up and the loss curve are in the run directory when the run finishes.
    writeup = (run_dir / "WRITEUP.md").read_text()
    assert "| steps | 8 |" in writeup and f"`{launch}`" in writeup
    assert (run_dir / "loss_curve.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.slow
def test_trnf_eval_scores_the_kit_checkpoint(two_rank_run: tuple[Path, Path, subprocess.CompletedProcess[str]], capsys: pytest.CaptureFixture[str]) -> None:
    train_py, run_dir, result = two_rank_run
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = Path(_summary(run_dir)["final_checkpoint"])
    code, out, err = run_cli(["eval", "--train-py", str(train_py), "--checkpoint", str(checkpoint), "--json",
                              "--tokens", "4096", "--seq-len", "32", "--batch-size", "4", "--device", "cpu"], capsys)
    assert code == 0, err
    [scored] = json.loads(out)["results"]
    assert scored["status"] == "ok" and 0 < scored["val_bpb"] < 20
    assert scored["causality"]["passed"] and scored["batch_independence"]["passed"]


@pytest.mark.slow
def test_crash_on_rank_1_reports_rank_1s_traceback(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = write_train_py(tmp_path / "team", "crash")
    run_dir = tmp_path / "run"
    code, _, err = run_cli(["train", "--train-py", str(train_py), "--nproc", "2", "--out", str(run_dir), *RUN_TIMEOUT], capsys)
    assert code == 1
    [line] = error_lines(err)
    assert "crashed on rank 1" in line and "RuntimeError: injected failure on rank 1 at step 2" in line
    # One complete line naming where the traceback is; the tracebacks stay in the ranks' logs.
    assert line.endswith(f"(traceback: {run_dir / 'logs' / 'rank1.stderr.log'})")
    assert "Traceback" not in err and "ChildFailedError" not in err
    assert 'raise RuntimeError("injected failure on rank 1 at step 2")' in (run_dir / "logs" / "rank1.stderr.log").read_text()
    summary = _summary(run_dir)
    assert summary["status"] == "crashed" and summary["failed_rank"] == 1 and summary["exit_code"] == 1


@pytest.mark.slow
def test_an_abort_in_python_shutdown_after_finishing_is_a_note_not_a_crash(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = write_train_py(tmp_path / "team", "exitabort")
    run_dir = tmp_path / "run"
    code, _, err = run_cli(["train", "--train-py", str(train_py), "--nproc", "2", "--out", str(run_dir), *RUN_TIMEOUT], capsys)
    assert code == 0, err[-3000:]
    assert error_lines(err) == []
    # rank 1's, or rank 0's when torch's own gloo race aborted it first (the same signature)
    assert re.search(r"note: rank ([01]) aborted while Python shut down, after train.py had finished \(torchrun exit 1\)", err)
    summary = _summary(run_dir)
    assert summary["status"] == "completed" and summary["problems"] == [] and summary["failed_rank"] is None
    assert summary["exit_code"] == 1 and summary["steps"] == 8 and summary["reported_val_bpb"] > 0
    [note] = [n for n in summary["notes"] if "aborted while Python shut down" in n]
    log = run_dir / "logs" / f"rank{note.split()[1]}.stderr.log"
    assert str(log) in note
    # trnf started the ranks with faulthandler on: the dump that tells shutdown from a crash.
    assert "<no Python frame>" in log.read_text()


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and pid_alive(int(entry.name)):
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_hang_is_killed_at_the_timeout_with_no_process_left(sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = write_train_py(tmp_path / "team", "hang")
    run_dir = tmp_path / "run"
    # Long enough for torchrun and both ranks to start on a busy machine and write their pids.
    code, _, err = run_cli(["train", "--train-py", str(train_py), "--nproc", "2", "--out", str(run_dir), "--timeout", "60"], capsys)
    assert code == 1
    [line] = error_lines(err)
    assert "--timeout 60 s" in line and "killed" in line
    pids = [int(p) for rank in (0, 1) for p in (train_py.parent / "pids" / f"rank{rank}").read_text().split()]
    assert len(pids) == 4  # each rank and its `sleep` child
    assert not [pid for pid in pids if pid_alive(pid)]
    assert _processes_mentioning(str(train_py.parent)) == []
    assert _summary(run_dir)["status"] == "timed_out"


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "code", "message"), [
    ("nan", 3, "diverged: loss is NaN/inf at step 2"),
    ("nolog", 1, "never called prepare.record_step_boundary"),
    ("overbudget", 1, "over budget: charged"),
])
def test_nan_missing_step_log_and_over_budget_fail_the_run(mode: str, code: int, message: str, sample_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train_py = write_train_py(tmp_path / "team", mode)
    run_dir = tmp_path / "run"
    got, _, err = run_cli(["train", "--train-py", str(train_py), "--out", str(run_dir), *RUN_TIMEOUT, "--", "--steps", "4"], capsys)
    assert got == code
    [line] = error_lines(err)
    assert message in line
    summary = _summary(run_dir)
    assert summary["status"] == ("diverged" if mode == "nan" else "completed")
    assert summary["world_size"] == 1 and summary["final_loss"] is not None
    # The script's own flags went through: 4 steps, and the record says how it was launched.
    assert "step 3 | loss" in err and "step 4 |" not in err
    assert (run_dir / "launch.txt").read_text().strip().endswith("--nproc_per_node=1 train.py --steps 4")
    assert "not part of a valid submission launch" in err
    if mode == "nolog":
        assert summary["charged_seconds"] is None and "charged_seconds" in summary["missing_fields"]
    if mode == "overbudget":
        assert summary["over_budget"] is True and summary["charged_seconds"] > 1800 and summary["headroom_seconds"] < 0


@pytest.mark.slow
def test_ctrl_c_stops_every_process_and_still_writes_the_summary(sample_home: Path, tmp_path: Path) -> None:
    import signal
    import time

    train_py = write_train_py(tmp_path / "team", "hang")
    run_dir = tmp_path / "run"
    # A shell's background job inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt: give the child the default disposition, as a terminal would.
    proc = subprocess.Popen([sys.executable, "-m", "trnfrontier", "train", "--train-py", str(train_py), "--out", str(run_dir), *RUN_TIMEOUT],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pid_file = train_py.parent / "pids" / "rank0"
    deadline = time.monotonic() + 600  # a bound for a stuck test, not a performance assertion
    while not pid_file.is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.is_file(), proc.communicate()[1][-3000:] if proc.poll() is not None else "rank 0 never started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted: every process of the run was stopped" in err
    assert not [pid for pid in map(int, pid_file.read_text().split()) if pid_alive(pid)]
    assert _processes_mentioning(str(train_py.parent)) == []
    assert _summary(run_dir)["status"] == "interrupted"
    # The message's command starts it again in the same folder.
    assert f"start it again with `trnf train --train-py {train_py} --nproc 1 --lnc 2 --out {run_dir}" in err


def test_an_interrupted_kit_run_directory_accepts_the_rerun(tmp_path: Path) -> None:
    from trnfrontier.errors import UsageError
    from trnfrontier.kit import train_kit

    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "rank0.stdout.log").write_text("step 1\n")
    (run_dir / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    assert train_kit._prepare_run_dir(run_dir) == run_dir.resolve()
    assert not any(run_dir.iterdir())  # the interrupted attempt is gone, the folder is ready
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    with pytest.raises(UsageError, match="already exists"):
        train_kit._prepare_run_dir(run_dir)
    options = train_kit.KitOptions(Path("entry/train.py"), nproc=4, lnc=2, args=("--lr", "0.1"))
    assert train_kit.rerun_command(options, run_dir) == (
        f"trnf train --train-py entry/train.py --nproc 4 --lnc 2 --out {run_dir} -- --lr 0.1"
    )
