"""`trnf verify`: the submission gate. One module per concept; ``verify_archive`` runs them all.

The rules it applies are ``trnfrontier.contract``'s (launch shapes, pins, the budget from
logs, checkpoint checks, allowed imports); the sandbox and the model server it runs archive
code in are ``trnfrontier.untrusted``'s. This package is the gate around them:

- ``runner``: ``verify_archive``, every check in order (``CHECK_NAMES``).
- ``report``: ``Check`` and ``Report``, one line per check and the verdict.
- ``filetype``: what a file is when it is not the tar archive verify expects.
- ``archive``: safe extraction of a hostile archive.
- ``canonical``: the archive is byte for byte what ``trnf package`` would write.
- ``manifest``: manifest.json lists exactly the other files, with sizes and SHA256.
- ``claims``: the manifest's ``claimed`` block and the settings a rerun scores at.
- ``statements``: what an archive says of its own run's budget beyond the step log.
- ``screen``: the static screen, by AST, never by importing.
- ``screen_bypass``: the screen's second pass, known ways of hiding code or imports.
- ``codeblobs``: data carried in code (weight tables, encoded blobs).
- ``valtext``: validation text carried in an archive, in any plain encoding.
- ``dryrun``: ``--dry-run``, a few CPU steps of train.py with only the organisers' packages.
- ``scoring``: the trusted scorer's functions, captured before archive code runs.
- ``modelcheck``: the contract probe's judgements on logits the sandboxed model returned.
- ``identity``: the scored model is the checkpoint's, tensor by tensor.
- ``mixing``: check rows mixed into the very forwards that produce the score.
- ``rerun``: ``--rerun-eval``, the trusted ``evaluate_bpb`` on the archive's model.
- ``inference_check``: Phase 2, the archive's inference.py scores the trained model in time.
"""

from trnfrontier.verify.report import Check, Report
from trnfrontier.verify.runner import Options, verify_archive

__all__ = ["Check", "Options", "Report", "verify_archive"]
