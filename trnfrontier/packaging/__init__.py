"""`trnf package` and `trnf init`: submission archives (format in trnfrontier/submission.py)
and the one generator of train.py files.

Modules, one concept each: ``run`` reads a run directory and decides what would be
refused; ``flatten`` inlines runtime modules into one file; ``trainpy`` generates
train.py (package, ``--single-file`` and ``trnf init``); ``writeup`` writes WRITEUP.md and
the loss-curve PNG; ``kit`` collects a team's own train.py and what it imports;
``build`` assembles, screens and writes the archive.
"""
