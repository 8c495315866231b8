"""Where a kit run's train.py writes its checkpoint: a folder of the run's own.

The kit's train.py takes its output folder from ``--out-dir``, whose default is
``NEURON_COMPETITION_R1_OUT_DIR`` (else ``out``: ``out/final.pt`` beside the script, as on
the organisers' machine). `trnf train --train-py` runs the script in its own folder, so two
runs of one script at once (a sweep's trials) would write, and take, each other's
``out/final.pt``. Unless the user chose the folder, trnf therefore sets the variable to
``<run dir>/out`` (absolute) and looks there first. The user chose it when they set the
variable (non-empty) or passed ``--out-dir DIR`` / ``--out-dir=DIR`` (the kit's flag, spelled
in full) after ``--``; a relative choice means what it means to the script, whose working
directory is its own folder.

A script that ignores the variable still writes beside itself. The run still finds that
checkpoint (written since it began, as before) and records that the script ignores the
knob (``out_dir_ignored`` in summary.json): two runs of it at once would collide, which a
sweep running trials at once turns into a failure of the trial.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trnfrontier.contract.checkpoint import find_checkpoint
from trnfrontier.contract.kit import OUT_DIR_ENV, OUT_DIR_FLAG
from trnfrontier.runtime.rundir import KIT_FILE, KIT_OUT_DIR

# trnf's record of a kit run's launch, in its run directory: a folder beside it named
# KIT_OUT_DIR is that run's output, never another run's checkpoint to take.
LAUNCH_RECORD = "launch.json"
BY_TRNF = "trnf"  # who chose the folder: trnf, else OUT_DIR_ENV or OUT_DIR_FLAG (the user)


@dataclass(frozen=True)
class OutDir:
    path: Path  # absolute
    chosen_by: str  # BY_TRNF, OUT_DIR_ENV or OUT_DIR_FLAG

    def env(self) -> dict[str, str]:
        """What the run's environment gains: the variable, when trnf chose the folder."""
        return {OUT_DIR_ENV: str(self.path)} if self.chosen_by == BY_TRNF else {}

    def record(self, found: Found) -> dict[str, object]:
        """summary.json's keys: where the script was told to write, by whom, and whether it ignored that."""
        return {"out_dir": str(self.path), "out_dir_chosen_by": self.chosen_by, "out_dir_ignored": found.ignored}


@dataclass(frozen=True)
class Found:
    checkpoint: Path | None
    ignored: bool  # trnf chose the folder, and the script wrote beside itself instead


def flag_value(args: Sequence[str]) -> str | None:
    """The value of ``--out-dir`` among the script's arguments (the last one wins, as in argparse)."""
    value = None
    for i, word in enumerate(args):
        if word == OUT_DIR_FLAG and i + 1 < len(args):
            value = args[i + 1]
        elif word.startswith(f"{OUT_DIR_FLAG}="):
            value = word.split("=", 1)[1]
    return value


def choose(env: Mapping[str, str], args: Sequence[str], run_dir: Path, script_dir: Path) -> OutDir:
    """The run's output folder: the user's (``--out-dir``, else the variable), else ``<run dir>/out``."""
    flag = flag_value(args)
    if flag:
        return OutDir(_absolute(flag, script_dir), OUT_DIR_FLAG)
    if env.get(OUT_DIR_ENV):
        return OutDir(_absolute(env[OUT_DIR_ENV], script_dir), OUT_DIR_ENV)
    return OutDir(run_dir / KIT_OUT_DIR, BY_TRNF)


def _absolute(value: str, script_dir: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else script_dir / path


def another_runs_output(path: Path) -> bool:
    """``path`` lies in a kit run's output folder (``<run dir>/out``, beside its launch record)."""
    return any(folder.name == KIT_OUT_DIR and (folder.parent / LAUNCH_RECORD).is_file() for folder in path.parents)


def find(out: OutDir, script_dir: Path, run_dir: Path, since: float) -> Found:
    """The checkpoint the run wrote since ``since``: in its output folder (``final.pt``, else the
    newest ``*.pt``), else beside the script (the kit's ``out/final.pt``, else the newest
    ``*.pt``; never in trnf's run directory or another run's output folder)."""
    ours = run_dir == out.path or run_dir in out.path.parents
    inside = find_checkpoint(out.path, since=since, preferred=Path(KIT_FILE), exclude=None if ours else run_dir)
    if inside is not None:
        return Found(inside, ignored=False)
    beside = find_checkpoint(script_dir, since=since, exclude=run_dir, skip=another_runs_output)
    return Found(beside, ignored=beside is not None and out.chosen_by == BY_TRNF)
