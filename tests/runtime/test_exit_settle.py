"""trnf_exit_settle: loaded where a team's ranks start, it settles gloo before Python exits.

The first tests check that each way of installing it gets it loaded, by Python itself,
and that it settles only in a torchrun worker using torch.distributed (``time.sleep`` is
replaced by a print, so nothing waits). The last runs the race it exists for: a kit-style
script (its own ``init_process_group``, DDP, a final all-reduce, no trnf code) under
torchrun, exiting right after the all-reduce. Without the settle, 4 of 15 such runs
aborted on a loaded 2-core machine; with it, none of 20.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_distributed_shutdown import LAST_ALL_REDUCE
from trnfrontier.runtime import exit_settle

# Exits with a fake torch.distributed imported; time.sleep prints instead of sleeping.
PROBE = """\
import sys, time, types
sys.modules["torch.distributed"] = types.ModuleType("torch.distributed")
time.sleep = lambda seconds: print(f"settled {seconds}")
print("loaded" if "trnf_exit_settle" in sys.modules else "not loaded")
"""

KIT_STYLE = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()
""" + LAST_ALL_REDUCE + """\
dist.destroy_process_group()
"""

WORKER = {"TORCHELASTIC_RUN_ID": "test"}


def _python(argv: list[str], env: dict[str, str]) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCHELASTIC_RUN_ID")}
    done = subprocess.run(argv, env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.splitlines()


def test_a_pth_line_loads_it_in_a_venv_even_under_python_minus_I(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    site = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    exit_settle.add_to_site_packages(Path(site))
    assert _python([python, "-I", "-c", PROBE], WORKER) == ["loaded", f"settled {exit_settle.SETTLE_SECONDS}"]


def test_a_sitecustomize_loads_it_and_still_runs_the_one_it_shadows(tmp_path: Path) -> None:
    exit_settle.add_to_path(tmp_path / "settle")
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "sitecustomize.py").write_text("print('team sitecustomize')\n")
    path = os.pathsep.join([str(tmp_path / "settle"), str(tmp_path / "team")])
    assert _python([sys.executable, "-c", PROBE], {**WORKER, "PYTHONPATH": path}) == [
        "team sitecustomize", "loaded", f"settled {exit_settle.SETTLE_SECONDS}"]


def test_it_settles_only_in_a_torchrun_worker_that_uses_torch_distributed(tmp_path: Path) -> None:
    exit_settle.add_to_path(tmp_path / "settle")
    env = {"PYTHONPATH": str(tmp_path / "settle")}
    assert _python([sys.executable, "-c", PROBE], env) == ["loaded"]  # not under torchrun
    no_dist = PROBE.replace('sys.modules["torch.distributed"] = types.ModuleType("torch.distributed")', "")
    assert _python([sys.executable, "-c", no_dist], {**env, **WORKER}) == ["loaded"]


def run_under_torchrun(script: Path, settle: Path | None) -> subprocess.CompletedProcess[str]:
    """``script`` as two gloo ranks under torchrun, with the settle on PYTHONPATH or not."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **({"PYTHONPATH": str(settle)} if settle else {})})
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("round_", range(3))
def test_a_kit_style_script_exits_cleanly_with_it(round_: int, tmp_path: Path) -> None:
    exit_settle.add_to_path(tmp_path / "settle")
    script = tmp_path / "train.py"
    script.write_text(KIT_STYLE)
    done = run_under_torchrun(script, tmp_path / "settle")
    assert done.returncode == 0, done.stderr[-3000:]
