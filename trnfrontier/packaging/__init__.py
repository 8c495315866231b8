"""`trnf package` and `trnf init`: submission archives (format in trnfrontier/submission.py)
and the one generator of train.py files. One concept per module:

- ``finished_run``: a finished run directory, and the reasons to refuse packaging it.
- ``flatten``: inline runtime modules into one file (a single-file train.py).
- ``trainpy``: generate train.py (package, ``--single-file`` and ``trnf init``).
- ``writeup``: WRITEUP.md and the loss-curve PNG.
- ``run_report``: write those into a run directory when the run finishes.
- ``kit``: a team's own train.py and what it imports from its directory.
- ``build``: assemble, screen and write the archive.
"""
