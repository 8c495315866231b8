"""The inference.py trnf writes for a Phase 2 submission (``trnf init --phase 2``, ``trnf
package`` of a Phase 2 run): ``inference_template.py`` beside this module, as is.

The template implements the interface ``contract/inference.py`` infers, so it lives beside
it and changes with it. It is a real module (linted, type-checked, tested); an archive
carries its text under the organisers' name, ``inference.py``. Kept apart from
``contract/inference.py`` because that one imports torch and this must not: packaging and
``trnf init`` read the text without loading a model.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE = Path(__file__).with_name("inference_template.py")


def inference_py_source() -> str:
    """The text of the inference.py a Phase 2 submission ships."""
    return TEMPLATE.read_text(encoding="utf-8")
