"""`trnf sweep`: many training runs in parallel on Ray, every trial an ordinary run.

- ``spec``: the sweep file (pydantic; a bad one is one line naming the key);
- ``space``: the spec's search space as Ray Tune's, and a trial's parameters as
  ``trnf train`` overrides or script flags;
- ``trial``: what runs in a Ray worker for one trial: ``trnf train`` in a process of its
  own, followed through its run directory;
- ``engine``: Ray (embedded, or a cluster by address) and Ray Tune (grid, random, Optuna
  TPE; ASHA early stopping), start and resume;
- ``state``: ``sweep.json``, the sweep's own record, written atomically;
- ``report``: the table, the best trial's recipe and the figure, from the run directories.

Ray and Ray Tune are imported only here and only when a sweep runs (the ``sweep`` extra).
"""
