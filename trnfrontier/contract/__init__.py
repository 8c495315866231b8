"""The organisers' rules, in one package: what a submission and a run must be.

verify (the gate), kit (a team's own train.py) and packaging (the archive) all import
these; none of them restates a rule.

- ``phases``: each phase's facts as data (chips, launch shapes, budget and startup rules,
  metrics and their weights, what is inferred); Phase 1 is the default everywhere;
- ``launch``: the launch line (``launch.txt``) and the shapes it may take;
- ``kit``: the organisers' variable names (``NEURON_COMPETITION_R1_*``) and files;
- ``steplog``: the one reader of a step log (``read_step_log`` -> ``StepLog`` of
  ``Segment``s), over ``steplog_lines`` (what one line may be);
- ``budget``: the training budget from a step log, under the trusted prepare.py's
  accounting or the documented formula (``runtime.budget_rule``), and its cross-checks;
- ``checkpoint``: what a checkpoint must be (loads without running code, finite
  numbers) and where a kit-style run's checkpoint is found;
- ``pins``: the SHA256 of the prepare.py and tokenizer a submission must have used;
- ``allowed_imports``: what submission code may import (runtime vs the organisers'
  environment);
- ``inference``: the Phase 2 ``inference.py`` interface, as inferred;
- ``jsonstrict``: JSON from an archive or a run, read one way only.

Each phase's numbers are ``phases.PHASES``. Phase 1's (one Trainium2 chip, 30 minutes):
the launch shapes are ``launch.LNC_CHOICES`` and ``launch.NPROC_CHOICES``; the budget
(1800 s, 5 startup steps, 900 s cap) is ``runtime.budget_rule``'s, since the trainer's own
clock needs it and the runtime imports nothing of the tool layer (a recipe hands the
trainer its phase's budget as ``budget.seconds``).
"""
