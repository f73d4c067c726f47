"""TRL's conversational preference records with an implicit prompt (read by `--format preference` when the
first record's `chosen` is a list of messages and it has no `prompt`): `chosen` and `rejected` are whole
conversations, and the prompt is the messages they share from the start (TRL 1.16's `extract_prompt`)."""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import FIT, Fit, Pair, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import MISSING, as_object, structured
from packtool.core.encoding.shapes.preference import (
    CHOSEN,
    REJECTED,
    extract_prompt,
    is_messages,
    no_prompt,
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
    no_prompt(record, options.fields)
    prompt, chosen, rejected = extract_prompt(side(record, CHOSEN, True), side(record, REJECTED, True))
    return Pair(prompt, chosen, rejected, pair_tools(record, options.fields.tools))


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    if not isinstance(record, dict) or present(record, fields.prompt) is not MISSING:
        return None
    return (
        FIT
        if is_messages(present(record, CHOSEN)) and isinstance(structured(present(record, REJECTED)), list)
        else None
    )


SPEC = ShapeSpec(
    name="conversational-preference-implicit",
    fields={"prompt": "prompt"},
    convert=convert,
    detect=detect,
    clues=("chosen/rejected",),
    rank=70,
    chat=True,
    pairs=True,
)
