"""`trnf train` for a recipe: plan the run, start and follow its worker, recover a stopped one.

- ``plan``: validate the recipe, choose the run directory, refuse what would fail at once,
  fix the child's command and environment (``RunPlan``).
- ``supervise``: take the run's lock, start the child in its own process group, follow
  ``metrics.jsonl`` with a live view, read back ``summary.json`` (``run_plan``).
- ``worker``: ``python -m trnfrontier.train.worker``, the child: the runtime's entry point
  bound to its parent's life.
- ``interrupted``: a run that stopped early, and the one command that continues it.
- ``lifeline``: the trainer's half of binding a run to `trnf train`: it dies with trnf.

A team's own train.py (``trnf train --train-py``) is ``trnfrontier.kit``.
"""
