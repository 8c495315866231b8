"""CORE, the capability half of the Phase 2 score: nanochat's metric, item for item.

CORE (the DCLM paper's in-context-learning suite, as nanochat's ``core_eval.py`` and
``base_eval.evaluate_core`` compute it) scores a model on a bundle of tasks by
log-likelihood, never by generation. trnf reproduces every item's verdict and computes
them in batches. One concept per module:

- ``bundle``: read a bundle folder (``core.yaml``, ``eval_meta_data.csv``,
  ``eval_data/*.jsonl``) into tasks and items; a bad one is one ``TrnfError`` line naming
  the file (and line);
- ``fetch``: ``--bundle PATH|URL`` to a checked folder: download (resumable, atomic),
  SHA256 pin, safe unzip into the data home; the shipped format sample;
- ``render``: the prompts, exactly as nanochat renders them;
- ``sequences``: prompts to token rows with the scored span of each (BOS, crop);
- ``protocol``: the one call CORE scores through (``CoreBatch`` in, per-position losses
  and greedy predictions out) and the adapters for a model that returns logits;
- ``batching``: many items per forward, grouped by length;
- ``scoring``: verdicts from losses and predictions (nanochat's ``min``), near-ties;
- ``run``: a bundle on a model, sharded over ranks: accuracies, centered scores, CORE,
  the projection against the Phase 2 time limit.
"""
