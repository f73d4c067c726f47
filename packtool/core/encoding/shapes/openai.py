"""`--format openai`: OpenAI's fine-tuning chat records, `messages` whose assistant turns may carry a `weight`.

An assistant message with `"weight": 0` is context, not a target; `"weight": 1`, no weight, or a null
(a table's empty cell: Arrow and parquet give every message every key) is a target. The weight is
OpenAI's, not the template's: messages are rendered without it, so the ids equal transformers'
`apply_chat_template` of the messages with their `weight` keys removed. Top-level `tools` go to the
template as `tools=`, as for `--format chat`. `--assistant-turns last`: the last assistant turn, if its
weight is 1 (a record whose last turn is weighted 0 then has no target).

OpenAI's legacy function calling is read as OpenAI documents its replacement by tools: a top-level
`functions` list is `tools=` of `{"type": "function", "function": f}` each; an assistant message's
`function_call` (`{name, arguments}`) is its `tool_calls: [{"type": "function", "function": {name,
arguments}}]` (the arguments as written); a `function` message (`name`, `content`) is a `tool` message.
A record with both `functions` and `tools`, or a message with both `function_call` and `tool_calls`, is a
bad record. `parallel_tool_calls` tells OpenAI's trainer how the model may call tools; no chat template
reads it, so it changes no token (it is not checked).

Bad records (file:line, or rejects.jsonl): a weight on a message of another role, and a weight that is
not 0 or 1. OpenAI documents 0 and 1; the JSON integers are taken, and so are 0.0 and 1.0 (a table column
of weights with gaps holds floats), but not `true`/`false` (not numbers in JSON) nor "1" (a string).

`--format auto` picks it for records that carry a weight on a message, or OpenAI's legacy function
calling; a record with neither is a chat record that this shape reads alike (`Fit(exact=False)`: OpenAI
files often weight a few records only), so a file with weights on some records is `openai`, and one with
none stays `chat`. A `chat` record that carries them is read as this shape reads it (`chat.py`): a weight
or a function is never dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from packtool.core.encoding.shapes.base import FIT, Conversation, Fit, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import conversation_field, get_field, structured, tools_of

WEIGHT = "weight"
#: OpenAI's legacy function calling: the top-level list, the assistant message's call, the result's role
FUNCTIONS, FUNCTION_CALL, FUNCTION_ROLE = "functions", "function_call", "function"


def convert(record: Any, options: ShapeOptions) -> Conversation:
    no_record_weight(record)
    messages, reason = get_field(record, options.fields.messages)
    if reason is not None:
        raise ShapeError(reason)
    return openai_conversation(record, structured(messages), options.fields.tools)


def openai_conversation(record: Any, messages: Any, tools_field: str) -> Conversation:
    """Messages (already read from the record) as OpenAI's format means them: weights and legacy functions."""
    tools = record_tools(record, tools_field)
    if not isinstance(messages, list):
        return Conversation(messages, tools)  # the chat path names what is wrong with it
    plain = [_modern(m, i) for i, m in enumerate(messages)]
    plain, targets = weighed(plain)
    return Conversation(plain, tools, targets)


def record_tools(record: Any, name: str) -> list[Any] | None:
    """The record's `tools`, or its legacy `functions` as tools; both is a bad record."""
    if not isinstance(record, dict):
        return None
    tools = tools_of(record, name)
    functions = tools_of(record, FUNCTIONS)  # a list of objects, or a JSON string of one, as tools
    if functions is None:
        return tools
    if tools is not None:
        raise ShapeError(f"the record has both {name!r} and OpenAI's legacy 'functions', keep one of them")
    return [{"type": "function", "function": f} for f in functions]


def _modern(message: Any, i: int) -> Any:
    """A message with OpenAI's legacy function calling as tool calling (see the module docstring)."""
    if not isinstance(message, dict):
        return message
    if message.get("role") == FUNCTION_ROLE:
        message = {**message, "role": "tool"}
    call = message.get(FUNCTION_CALL)
    if call is None:
        return message
    if message.get("role") != "assistant":
        raise ShapeError(f"message {i} has a 'function_call' but is a {message.get('role')!r} message")
    if message.get("tool_calls") is not None:
        raise ShapeError(f"message {i} has both 'function_call' and 'tool_calls', keep one of them")
    call = structured(call)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
        raise ShapeError(f'message {i} function_call is not a {{"name": ..., "arguments": ...}} object')
    out = {k: v for k, v in message.items() if k != FUNCTION_CALL}
    out["tool_calls"] = [{"type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]
    return out


def no_preference_pair(record: Any, messages: Any) -> None:
    """A record with `chosen` and `rejected` whose conversation holds no assistant message is a preference pair
    (LLaMA-Factory's ranking ShareGPT: the conversation ends on the user's turn, the answers sit in
    `chosen`/`rejected`): read as a conversation it would train on neither answer, so it is refused by name.
    (A record whose messages hold the answer, e.g. UltraFeedback's `messages`, stays a conversation.)"""
    if not (isinstance(record, dict) and "chosen" in record and "rejected" in record and isinstance(messages, list)):
        return
    if any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        return
    raise ShapeError(
        "the record has 'chosen' and 'rejected' and its conversation no assistant message: a preference pair, "
        "which read as a conversation trains on neither answer; pass --format preference (or auto)"
    )


def no_record_weight(record: Any) -> None:
    """A conversation record's own `weight` (a sample weight, which no format here defines) is refused unless it
    is 1 (or null): weights are per assistant message, and a `"weight": 0` record is never trained in silence."""
    weight = record.get(WEIGHT) if isinstance(record, dict) else None
    if weight is None or (type(weight) in (int, float) and weight == 1):
        return
    shown = json.dumps(weight, default=repr)[:40]
    raise ShapeError(
        f"the record has 'weight' {shown}: weights are read per assistant message (OpenAI's format), not per "
        "record; drop the record (weight 0) or the key"
    )


def weighed(
    messages: list[Any], label: Callable[[int], str] = lambda i: f"message {i}"
) -> tuple[list[Any], tuple[bool, ...] | None]:
    """Messages without their `weight` keys, and per message whether it is a target (None when no assistant
    message is context: every assistant turn is a target). ShapeError for a weight OpenAI does not define."""
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
                    f"{label(i)} has a 'weight' but is a {message.get('role')!r} message "
                    "(only assistant messages carry one in OpenAI's format)"
                )
            if type(weight) not in (int, float) or weight not in (0, 1):
                shown = json.dumps(weight, default=repr)  # as the JSON reads; a table's other types by repr
                raise ShapeError(f"{label(i)} has weight {shown}, not 0 or 1 (0: context, 1: target)")
        plain.append({k: v for k, v in message.items() if k != WEIGHT} if WEIGHT in message else message)
        targets.append(assistant and weight != 0)
    context = any(
        not t and isinstance(m, dict) and m.get("role") == "assistant" for m, t in zip(plain, targets, strict=True)
    )
    return plain, tuple(targets) if context else None


def openai_keys(record: Any, messages: Any) -> bool:
    """Whether a record carries what only OpenAI's format defines: a message weight, or legacy functions."""
    if isinstance(record, dict) and record.get(FUNCTIONS) is not None:
        return True
    return isinstance(messages, list) and any(
        isinstance(m, dict)
        and (m.get(WEIGHT) is not None or m.get(FUNCTION_CALL) is not None or m.get("role") == FUNCTION_ROLE)
        for m in messages
    )


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    """role/content turns under `messages`: exactly this shape when it carries OpenAI's own keys."""
    if conversation_field(record) != (fields.messages, "role"):
        return None
    return FIT if openai_keys(record, structured(record[fields.messages])) else Fit(exact=False)


SPEC = ShapeSpec(
    name="openai",
    fields={"messages": "messages"},
    convert=convert,
    detect=detect,
    clues=("messages",),
    rank=60,
    chat=True,
)
