"""`trnf verify`: the submission gate. One module per concept; ``verify_archive`` runs them all.

The rules it applies are ``trnfrontier.contract``'s (launch shapes, pins, the budget from
logs, checkpoint checks, allowed imports); this package is the gate around them: ``archive``
(safe extraction), ``canonical`` (byte for byte what ``trnf package`` writes), ``manifest``,
``screen`` and ``screen_bypass`` (the static screen), ``sandbox`` (bubblewrap), archive code
served in the sandbox (``modelserver`` inside, ``served`` outside, ``scoring`` the trusted
side, ``modelcheck`` the contract probe's judgements), ``dryrun``, ``report``
(Check/Report) and ``runner`` (the order).
"""

from trnfrontier.verify.report import Check, Report
from trnfrontier.verify.runner import Options, verify_archive

__all__ = ["Check", "Options", "Report", "verify_archive"]
