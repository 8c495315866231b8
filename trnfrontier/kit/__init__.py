"""Kit mode: trnf on a team's own train.py (the organisers' layout), not a trnf recipe.

- ``train_kit.train_kit``: launch it as the organisers do, per-rank logs, budget accounting,
  summary.json / metrics.jsonl in a run directory.
- ``dryrun.dry_run_kit``: the same file for a few CPU steps in a clean environment, stage
  by stage, before chip time is spent.
- What `trnf train --train-py` prints and how it exits: ``trnfrontier/cli/train_kit.py``.
"""
