"""`--format openai`: OpenAI's fine-tuning chat records, `messages` whose assistant turns may carry a `weight`.

An assistant message with `"weight": 0` is context, not a target; `"weight": 1`, no weight, or a null
(a table's empty cell: Arrow and parquet give every message every key) is a target. The weight is
OpenAI's, not the template's: messages are rendered without it, so the ids equal transformers'
`apply_chat_template` of the messages with their `weight` keys removed. Top-level `tools` go to the
template as `tools=`, as for `--format chat`. `--assistant-turns last`: the last assistant turn, if its
weight is 1 (a record whose last turn is weighted 0 then has no target).

Bad records (file:line, or rejects.jsonl): a weight on a message of another role, and a weight that is
not 0 or 1. OpenAI documents 0 and 1; the JSON integers are taken, and so are 0.0 and 1.0 (a table column
of weights with gaps holds floats), but not `true`/`false` (not numbers in JSON) nor "1" (a string).

`--format auto` picks it for records that carry a weight on a message; a record with no weight is a
chat record that this shape reads alike (`Fit(exact=False)`: OpenAI files often weight a few records
only), so a file with weights on some records is `openai`, and one with none stays `chat`.
"""

from __future__ import annotations

import json
from typing import Any

from packtool.core.encoding.shapes.base import FIT, Conversation, Fit, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import conversation_field, get_field, structured, tools_of

WEIGHT = "weight"


def convert(record: Any, options: ShapeOptions) -> Conversation:
    messages, reason = get_field(record, options.fields.messages)
    if reason is not None:
        raise ShapeError(reason)
    messages = structured(messages)
    tools = tools_of(record, options.fields.tools) if isinstance(record, dict) else None
    if not isinstance(messages, list):
        return Conversation(messages, tools)  # the chat path names what is wrong with it
    plain: list[Any] = []
    targets: list[bool] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            plain.append(message)
            targets.append(False)
            continue
        assistant = message.get("role") == "assistant"
        weight = message.get(WEIGHT)
        if weight is not None:
            if not assistant:
                raise ShapeError(
                    f"message {i} has a 'weight' but is a {message.get('role')!r} message "
                    "(only assistant messages carry one in OpenAI's format)"
                )
            if type(weight) not in (int, float) or weight not in (0, 1):
                shown = json.dumps(weight, default=repr)  # as the JSON reads; a table's other types by repr
                raise ShapeError(f"message {i} has weight {shown}, not 0 or 1 (0: context, 1: target)")
        plain.append({k: v for k, v in message.items() if k != WEIGHT} if WEIGHT in message else message)
        targets.append(assistant and weight != 0)
    context = any(
        not t and isinstance(m, dict) and m.get("role") == "assistant" for m, t in zip(plain, targets, strict=True)
    )
    return Conversation(plain, tools, tuple(targets) if context else None)


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    """role/content turns under `messages`: exactly this shape when some message carries a weight."""
    if conversation_field(record) != (fields.messages, "role"):
        return None
    weighted = any(turn.get(WEIGHT) is not None for turn in structured(record[fields.messages]))
    return FIT if weighted else Fit(exact=False)


SPEC = ShapeSpec(
    name="openai",
    fields={"messages": "messages"},
    convert=convert,
    detect=detect,
    clues=("messages",),
    rank=60,
    chat=True,
)
