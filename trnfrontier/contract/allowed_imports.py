"""What code that runs in the organisers' environment may import: the one allow-list.

The organisers' environment has the standard library and the packages below, nothing
else. The runtime layer (``trnfrontier/runtime/``, carried by every submission) is held
to a narrower list, since its brief is "stdlib, torch, numpy and prepare" (plus the
Neuron packages, imported lazily). ``tests/runtime/test_layering.py`` checks the
runtime against ``RUNTIME_PACKAGES``; ``trnf verify``'s static screen checks a
submission's files against ``ORGANISER_PACKAGES``. Top-level module names, except
``*_DISTRIBUTIONS``: the installed distributions a dry run's clean venv holds.
"""

from __future__ import annotations

# On a Trainium DLAMI only; code that uses them imports them lazily.
NEURON_PACKAGES = frozenset({"torch_neuronx", "torch_xla", "nki", "neuronxcc"})

# Besides the standard library, what the runtime layer may import.
RUNTIME_PACKAGES = frozenset({"torch", "numpy", "prepare"}) | NEURON_PACKAGES

# Besides the standard library, what the organisers' environment provides to a submission.
ORGANISER_PACKAGES = RUNTIME_PACKAGES | frozenset({"tiktoken", "pyarrow"})

# The same environment as installed distributions (what a dry run's clean venv links in,
# with their run-time dependencies): always, and the Neuron ones where installed.
ORGANISER_DISTRIBUTIONS = ("torch", "numpy", "tiktoken", "pyarrow")
OPTIONAL_DISTRIBUTIONS = ("torch-neuronx", "torch-xla", "nki", "neuronx-cc")
