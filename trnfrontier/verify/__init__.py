"""`trnf verify`: the submission gate. One module per concept; ``verify_archive`` runs them all.

archive (safe extraction), manifest, pins, launch, screen (AST), checkpoint, budget,
contract (the subprocess that runs probe.py), dryrun, report (Check/Report), runner.
"""

from trnfrontier.verify.report import Check, Report
from trnfrontier.verify.runner import Options, verify_archive

__all__ = ["Check", "Options", "Report", "verify_archive"]
