"""`--format chat`: `messages` of `{role, content, ...}` as given, rendered by the chat template.

Roles are renamed by `--role-map` when one is given (a role the map does not name is kept), and the
record's top-level `tools` go to the template as `tools=` (TRL and OpenAI's fine-tuning files put
them there). Every assistant turn is a target.

A record that carries what only OpenAI's format defines (a message `weight`, the legacy `functions`,
`function_call` or `function` role) is read as `--format openai` reads it (`openai.py`), after the role
map: a `"weight": 0` turn is context, and functions are tools. A template never sees those keys, so
they are never dropped in silence, whichever shape `--format auto` took from the first records.
"""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import Conversation, Fit, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import conversation_field, get_field, structured, tools_of
from packtool.core.encoding.shapes.openai import (
    no_preference_pair,
    no_record_weight,
    openai_conversation,
    openai_keys,
)
from packtool.core.encoding.shapes.roles import role_key, role_table


def convert(record: Any, options: ShapeOptions) -> Conversation:
    no_record_weight(record)
    messages, reason = get_field(record, options.fields.messages)
    if reason is not None:
        raise ShapeError(reason)
    messages = structured(messages)
    if options.role_map and isinstance(messages, list):
        table = role_table(options.role_map, {})
        messages = [_renamed(m, table) for m in messages]
    no_preference_pair(record, messages)
    if openai_keys(record, messages):
        return openai_conversation(record, messages, options.fields.tools)
    return Conversation(messages, tools_of(record, options.fields.tools) if isinstance(record, dict) else None)


def _renamed(message: Any, table: dict[str, str]) -> Any:
    """A chat message with its role through `--role-map` (a role the map does not name is kept as given)."""
    role = message.get("role") if isinstance(message, dict) else None
    mapped = table.get(role_key(role)) if isinstance(role, str) else None
    return message if mapped is None else {**message, "role": mapped}


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    """role/content turns under the usual conversation fields (`conversation`: LMSYS-Chat-1M, WildChat)."""
    found = conversation_field(record)
    if found is None or found[1] != "role":
        return None
    return Fit(() if found[0] == fields.messages else (("messages", found[0]),))


SPEC = ShapeSpec(
    name="chat",
    fields={"messages": "messages"},
    convert=convert,
    detect=detect,
    clues=("messages", "conversations", "conversation"),
    rank=50,
    chat=True,
    role_map=True,
)
