"""`trnf eval`: the scorer's number for trained checkpoints, and nanochat's CORE.

- ``library``: the command's library: settings per checkpoint, one fresh worker process
  each, the verdict and the ranking.
- ``spec``: ``WorkerSpec``, what one worker runs with (crosses the process boundary as JSON).
- ``worker``: ``python -m trnfrontier.evaluate.worker``: loads one model (a trnf checkpoint
  or a kit train.py's ``load_for_eval``), checks it and scores it with the trusted prepare.py.
- ``core/``: CORE, the capability half of the Phase 2 score (``trnf eval --core``).
"""
