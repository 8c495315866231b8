"""Kit mode: trnf on a team's own train.py (the organisers' layout), not a trnf recipe.

- ``train_kit.train_kit``: launch it as the organisers do, per-rank logs, budget accounting,
  summary.json / metrics.jsonl in a run directory.
- ``dryrun.dry_run_kit``: the same file for a few CPU steps in a clean environment, stage
  by stage, before chip time is spent.
- ``harness``: that clean environment (a venv with only the organisers' packages), the
  sandbox it runs in and loading the checkpoint back; `trnf verify --dry-run` runs an
  archive's train.py through it too.
- ``launch`` (the torchrun command), ``logs`` (the ranks' logs and what failed),
  ``preflight`` (checks before launch), ``summary`` (summary.json / metrics.jsonl).
- What `trnf train --train-py` prints and how it exits: ``trnfrontier/cli/train_kit.py``.
"""
