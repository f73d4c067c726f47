"""`--format alpaca` (LLaMA-Factory's convention): system, the `history` pairs, then user = the non-empty of
`instruction` and `input` joined by "\\n", assistant = `output`. Every assistant turn is a target."""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import FIT, Conversation, Fit, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import as_object, optional, required, structured, system_of, text


def alpaca_conversation(record: Any, fields: ShapeFields) -> Conversation:
    """One Alpaca record as messages (see the module docstring)."""
    record = as_object(record)
    output = text(required(record, fields.output, "the Alpaca record"), f"field {fields.output!r}")
    return Conversation([*alpaca_prompt(record, fields), {"role": "assistant", "content": output}])


def alpaca_prompt(record: dict[str, Any], fields: ShapeFields) -> list[dict[str, Any]]:
    """An Alpaca record's messages before its answer: system, the `history` pairs, the user turn."""
    instruction = text(required(record, fields.instruction, "the Alpaca record"), f"field {fields.instruction!r}")
    given = optional(record, fields.input)
    query = "" if given is None else text(given, f"field {fields.input!r}")
    messages = system_of(record, fields.system)
    history = structured(optional(record, fields.history))
    if history is not None:
        if not isinstance(history, list):
            raise ShapeError(f"field {fields.history!r} is not a list of [user, assistant] pairs")
        for k, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
                raise ShapeError(f"{fields.history}[{k}] is not a [user, assistant] pair of strings")
            messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    user = "\n".join(part for part in (instruction, query) if part)
    return [*messages, {"role": "user", "content": user}]


def convert(record: Any, options: ShapeOptions) -> Conversation:
    return alpaca_conversation(record, options.fields)


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    return FIT if isinstance(record, dict) and fields.instruction in record and fields.output in record else None


SPEC = ShapeSpec(
    name="alpaca",
    fields={
        "instruction": "instruction",
        "input": "input",
        "output": "output",
        "history": "history",
        "system": "system",
    },
    convert=convert,
    detect=detect,
    clues=("instruction/output",),
    rank=20,
    chat=True,
)
