"""The organisers' kit: the names of its variables and files, each spelled once here.

Their prepare.py and train.py (``docs/kit-contract.md``) read ``NEURON_COMPETITION_R1_*``
variables: the data root (``CACHE_DIR``), where ``record_step_boundary`` appends
(``STEP_LOG``), and the train.py's own knobs (``NUM_STEPS``, ``EVAL_PUBLIC``,
``EVAL_TOKENS``, ``COMPILE``, ...). A submission declares its launch in ``launch.txt``; a
kit-style train.py writes ``out/final.pt`` beside itself.

Two of these names live in the runtime, which needs them and may import nothing of the
tool layer: ``runtime.data_home.KIT_CACHE_DIR_ENV`` (the data root) and
``runtime.rundir.KIT_OUT_DIR`` / ``KIT_FILE`` (``out/final.pt``). They are not repeated
here; ``CHECKPOINT`` joins them.
"""

from __future__ import annotations

from pathlib import Path

from trnfrontier.runtime.data_home import KIT_CACHE_DIR_ENV
from trnfrontier.runtime.rundir import KIT_FILE, KIT_OUT_DIR

# Every variable of the organisers' kit starts with this; trnf forwards all of them to
# each child (``child_env``) and records them with a kit run.
ENV_PREFIX = "NEURON_COMPETITION_R1_"
# Where the organisers' prepare.py appends the step boundaries (the official step log).
STEP_LOG_ENV = f"{ENV_PREFIX}STEP_LOG"
# The kit train.py's knobs trnf sets or reads.
NUM_STEPS_ENV = f"{ENV_PREFIX}NUM_STEPS"
EVAL_PUBLIC_ENV = f"{ENV_PREFIX}EVAL_PUBLIC"
EVAL_TOKENS_ENV = f"{ENV_PREFIX}EVAL_TOKENS"
COMPILE_ENV = f"{ENV_PREFIX}COMPILE"
MAX_TRAIN_SECONDS_ENV = f"{ENV_PREFIX}MAX_TRAIN_SECONDS"
OUT_DIR_ENV = f"{ENV_PREFIX}OUT_DIR"
# The kit train.py's flag whose default OUT_DIR_ENV sets: its output folder (final.pt inside).
OUT_DIR_FLAG = "--out-dir"
# The kit's variables a sandboxed dry run receives from the caller's environment: its data
# root, step log and train.py knobs. Any other variable of the prefix (a token, a key) stays
# outside the sandbox.
KNOBS = (KIT_CACHE_DIR_ENV, STEP_LOG_ENV, NUM_STEPS_ENV, MAX_TRAIN_SECONDS_ENV, OUT_DIR_ENV, EVAL_PUBLIC_ENV,
         EVAL_TOKENS_ENV, COMPILE_ENV)

# The one-line launch command a submission declares (grammar: ``contract.launch``).
LAUNCH_FILE = "launch.txt"
# Where a kit-style train.py writes its checkpoint, relative to its own directory.
CHECKPOINT = Path(KIT_OUT_DIR) / KIT_FILE
