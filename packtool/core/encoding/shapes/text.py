"""`--format text`: one field (`--field`, a dotted path) is the document, every token a target (no tokens.loss).

A `.txt` input's documents are this shape's text as they are (`documents`); a JSON string record is not
a document but a bad record (it has no field).
"""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import FIT, Fit, Plain, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import get_text_field


def convert(record: Any, options: ShapeOptions) -> Plain:
    got, reason = get_text_field(record, options.fields.text)
    if got is None:
        raise ShapeError((reason or "bad text field") + _hint(record))
    return got, None


def _hint(record: Any) -> str:
    from packtool.core.encoding.shapes.detect import other_format_hint  # detect imports every shape: lazily

    return other_format_hint(record, "text")


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    return FIT if isinstance(record, dict) and isinstance(record.get(fields.text), str) else None


SPEC = ShapeSpec(
    name="text",
    fields={"text": "text"},
    convert=convert,
    detect=detect,
    clues=("text",),
    rank=10,
    loss=False,
    documents=True,
    recorded=("separator",),
)
