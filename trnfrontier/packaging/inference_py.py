"""The ``inference.py`` trnf writes for a Phase 2 submission (``trnf init --phase 2``,
``trnf package`` of a Phase 2 run): ``inference_template.py`` beside this module, as is.

The template is a real module of this package (linted, type-checked and tested like the
rest); the archive carries its text under the organisers' name, ``inference.py``.
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE = Path(__file__).with_name("inference_template.py")


def inference_py_source() -> str:
    """The text of the inference.py a Phase 2 submission ships."""
    return TEMPLATE.read_text(encoding="utf-8")
