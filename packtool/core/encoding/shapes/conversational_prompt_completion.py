"""TRL's conversational prompt-completion (read by `--format prompt-completion` when the first record's
prompt is a list of messages): `prompt + completion` rendered as one conversation with the record's
`tools`; only the completion's assistant turns are targets, an assistant turn inside the prompt is context.
"""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import FIT, Conversation, Fit, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import as_object, get_field, required, structured, tools_of


def convert(record: Any, options: ShapeOptions) -> Conversation:
    record = as_object(record)
    fields = options.fields
    parts = []
    for name in (fields.prompt, fields.completion):
        messages = structured(required(record, name, "the record"))
        if not isinstance(messages, list):
            raise ShapeError(
                f"field {name!r} is not a list of messages (got {type(messages).__name__}), but the first records "
                "hold lists (TRL's conversational prompt-completion): make every record alike"
            )
        parts.append(messages)
    prompt, completion = parts
    if not completion:
        raise ShapeError(f"field {fields.completion!r} is an empty list of messages")
    targets = (False,) * len(prompt) + tuple(isinstance(m, dict) and m.get("role") == "assistant" for m in completion)
    return Conversation(prompt + completion, tools_of(record, fields.tools), targets)


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    prompt, reason = get_field(record, fields.prompt)
    return FIT if reason is None and isinstance(structured(prompt), list) else None


SPEC = ShapeSpec(
    name="conversational-prompt-completion",
    fields={"prompt": "prompt", "completion": "completion"},
    convert=convert,
    detect=detect,
    clues=("prompt/completion",),
    rank=40,
    chat=True,
)
