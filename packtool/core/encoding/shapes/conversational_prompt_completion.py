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
    weighted = next(
        (i for i, m in enumerate(prompt + completion) if isinstance(m, dict) and m.get("weight") is not None), None
    )
    if weighted is not None:  # never dropped in silence: TRL's cut, not a weight, says what is trained
        raise ShapeError(
            f"message {weighted} has a 'weight' (OpenAI's), which prompt-completion records do not carry: the prompt "
            "is context and the completion the target; write the record as --format openai messages"
        )
    if not completion:
        raise ShapeError(f"field {fields.completion!r} is an empty list of messages")
    targets = (False,) * len(prompt) + tuple(isinstance(m, dict) and m.get("role") == "assistant" for m in completion)
    return Conversation(prompt + completion, tools_of(record, fields.tools), targets)


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    """A prompt that is a list of messages, as TRL's `is_conversational` decides (its first item a dict with a
    `role`); an empty prompt list when the completion is one (or empty too). A list of anything else (a CSV prompt cell of
    `[3, 1, 2]`) is not a conversation: the record is plain prompt-completion text."""
    prompt, reason = get_field(record, fields.prompt)
    if reason is not None:
        return None
    prompt = structured(prompt)
    if prompt == []:
        completion, reason = get_field(record, fields.completion)
        completion = structured(completion)
        listed = isinstance(completion, list) and all(isinstance(m, dict) for m in completion)
        return FIT if reason is None and listed and (not completion or _messages(completion)) else None
    return FIT if _messages(prompt) else None


def _messages(value: Any) -> bool:
    """A non-empty list whose first item is a message (a dict with a `role`), as TRL's `is_conversational`."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


SPEC = ShapeSpec(
    name="conversational-prompt-completion",
    fields={"prompt": "prompt", "completion": "completion"},
    convert=convert,
    detect=detect,
    clues=("prompt/completion",),
    rank=40,
    chat=True,
)
