"""TRL's standard preference records with an implicit prompt (read by `--format preference` when the first
record has `chosen` / `rejected` strings and no `prompt`): the prompt is their common beginning, as TRL 1.16's
`extract_prompt` cuts it (`preference.extract_prompt`)."""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import FIT, Fit, Pair, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import MISSING, as_object, tools_of
from packtool.core.encoding.shapes.preference import (
    CHOSEN,
    REJECTED,
    extract_prompt,
    is_text,
    no_prompt,
    one_reading,
    present,
    side,
    text_only,
)


def convert(record: Any, options: ShapeOptions) -> Pair:
    record = text_only(as_object(record))
    one_reading(record, False)
    no_prompt(record, options.fields)
    tools_of(record, options.fields.tools)
    return Pair(*extract_prompt(side(record, CHOSEN, False), side(record, REJECTED, False)))


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    if not isinstance(record, dict) or present(record, fields.prompt) is not MISSING or fields.instruction in record:
        return None  # an `instruction` is LLaMA-Factory's Alpaca ranking record
    return FIT if is_text(present(record, CHOSEN)) and is_text(present(record, REJECTED)) else None


SPEC = ShapeSpec(
    name="preference-implicit",
    fields={"prompt": "prompt"},
    convert=convert,
    detect=detect,
    clues=("chosen/rejected",),
    rank=70,
    pairs=True,
)
