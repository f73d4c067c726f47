"""TRL's conversational preference records with an explicit prompt (read by `--format preference` when the
first record's `prompt` is a list of messages): `prompt`, `chosen` and `rejected` lists of messages, the
completions following the prompt, with the record's `tools`."""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import FIT, Fit, Pair, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import as_object, structured
from packtool.core.encoding.shapes.preference import (
    CHOSEN,
    REJECTED,
    is_messages,
    no_template_kwargs,
    one_reading,
    pair_tools,
    present,
    side,
    text_only,
)


def convert(record: Any, options: ShapeOptions) -> Pair:
    record = text_only(as_object(record))
    one_reading(record, True)
    no_template_kwargs(record)
    prompt = side(record, options.fields.prompt, True)
    chosen, rejected = side(record, CHOSEN, True), side(record, REJECTED, True)
    return Pair(prompt, chosen, rejected, pair_tools(record, options.fields.tools))


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    if not isinstance(record, dict) or not is_messages(present(record, fields.prompt)):
        return None
    both = all(isinstance(structured(present(record, name)), list) for name in (CHOSEN, REJECTED))
    return FIT if both else None


SPEC = ShapeSpec(
    name="conversational-preference",
    fields={"prompt": "prompt"},
    convert=convert,
    detect=detect,
    clues=("chosen/rejected",),
    rank=70,
    chat=True,
    pairs=True,
)
