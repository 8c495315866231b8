"""Untrusted code (an archive's, or a team's train.py under a dry run): where it runs and how
its model is asked for logits. Nothing here trusts what that code says or writes.

- ``sandbox``: the boundary, bubblewrap (``bwrap``): a jail with one writable scratch
  directory, read-only binds, no network, a scrubbed environment and a wall-clock limit.
- ``modelserver``: run as a script inside the sandbox; loads the model through the
  code's own ``load_for_eval`` and answers logits requests over a pipe.
- ``served``: the host side of that server (``ServedModel``): starts it in the sandbox and
  checks every reply.
- ``treelimits``: limits on the sandboxed process tree as a whole (memory, tasks).
- ``tailpipe``: what a sandboxed process prints, kept bounded: the last bytes only.
- ``hostfs``: reading and removing what a sandbox wrote, on the host, trusting none of it.

verify (the contract probe, ``--rerun-eval``, ``--dry-run``), the kit's dry run and
``trnf doctor`` use them.
"""
