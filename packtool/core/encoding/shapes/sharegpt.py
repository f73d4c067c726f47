"""`--format sharegpt`: `conversations` of `{from, value}` turns, roles through `DEFAULT_ROLE_MAP` (plus
`--role-map`), matched whatever their case and surrounding space (`Human`, `GPT`: exports in the wild
have them). A `function_call` turn is an assistant message whose `tool_calls` come from its JSON value;
a top-level `system` string is the first message; top-level `tools` go to the template as `tools=`.
A turn's `weight` is read as OpenAI's (`openai.py`), never ignored: a `gpt` turn of weight 0 is context,
not a target; a weight on another turn, or not 0 or 1, is a bad record. A turn's other keys stay
on its message; every problem (unknown role, missing or non-string `value`,
unparseable `function_call`, empty conversation) is a `ShapeError` naming the turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from packtool.core.encoding.shapes.base import Conversation, Fit, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import (
    as_object,
    conversation_field,
    required,
    structured,
    system_of,
    text,
    tools_of,
)
from packtool.core.encoding.shapes.openai import no_preference_pair, no_record_weight, weighed
from packtool.core.encoding.shapes.roles import RoleMap, role_key, role_table
from packtool.formats import jsontext

#: the pseudo-role of a ShareGPT turn holding a tool call as JSON
FUNCTION_CALL = "function_call"
DEFAULT_ROLE_MAP: Mapping[str, str] = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
    FUNCTION_CALL: FUNCTION_CALL,
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}


def sharegpt_conversation(record: Any, fields: ShapeFields, role_map: RoleMap = ()) -> Conversation:
    """One ShareGPT record as messages (see the module docstring)."""
    record = as_object(record)
    no_record_weight(record)
    turns = structured(required(record, fields.messages, "the record"))
    if not isinstance(turns, list):
        raise ShapeError(f"field {fields.messages!r} is not a list of turns (got {type(turns).__name__})")
    if not turns:
        raise ShapeError(f"empty conversation (field {fields.messages!r} holds no turns)")
    table = role_table(role_map, DEFAULT_ROLE_MAP)
    messages = system_of(record, fields.system)
    first = len(messages)
    for i, turn in enumerate(turns):
        messages.append(_turn(turn, i, table))
    no_preference_pair(record, messages)
    plain, targets = weighed(messages, lambda i: f"turn {i - first}")
    return Conversation(plain, tools_of(record, fields.tools), targets)


def sharegpt_turn(turn: Any, i: int | str, table: dict[str, str]) -> dict[str, Any]:
    """One `{from, value}` turn as a message (`i` names it in errors: its index, or a field name)."""
    return _turn(turn, i, table)


def _turn(turn: Any, i: int | str, table: dict[str, str]) -> dict[str, Any]:
    if not isinstance(turn, dict):
        raise ShapeError(f"turn {i} is not an object (got {type(turn).__name__})")
    if "from" not in turn:
        raise ShapeError(f"turn {i} has no 'from' (its role)")
    name = turn["from"]
    role = table.get(role_key(name)) if isinstance(name, str) else None
    if role is None:
        hint = f"--role-map {name}=assistant" if isinstance(name, str) and name else "--role-map NAME=ROLE"
        raise ShapeError(f"turn {i} has unknown role {name!r} with no mapping (pass {hint})")
    if "value" not in turn:
        raise ShapeError(f"turn {i} has no 'value' (from {name!r})")
    value = text(turn["value"], f"turn {i} ({name}) 'value'")
    extra = {k: v for k, v in turn.items() if k not in ("from", "value") and v is not None}  # null = absent (Arrow)
    clash = sorted(k for k in extra if k in ("role", "content") or (role == FUNCTION_CALL and k == "tool_calls"))
    if clash:
        raise ShapeError(f"turn {i} has both 'from'/'value' and {', '.join(map(repr, clash))}, keep one of them")
    if role == FUNCTION_CALL:
        return {"role": "assistant", "tool_calls": _tool_calls(value, i), **extra}
    return {"role": role, "content": value, **extra}


def _tool_calls(value: str, i: int | str) -> list[dict[str, Any]]:
    """A function_call turn's JSON: one `{name, arguments}` object (or a list of them) -> transformers' tool_calls."""
    try:
        parsed = jsontext.loads(value)
    except json.JSONDecodeError as exc:
        raise ShapeError(f"turn {i} function_call value is not JSON ({exc.msg} at {exc.pos})") from None
    calls = parsed if isinstance(parsed, list) else [parsed]
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
            raise ShapeError(
                f'turn {i} function_call is not a {{"name": ..., "arguments": ...}} object (or a list of them)'
            )
        unknown = sorted(set(call) - {"name", "arguments", "id"})
        if unknown:
            raise ShapeError(f"turn {i} function_call has keys {unknown} besides name, arguments and id")
        tool_call: dict[str, Any] = {
            "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]},
        }
        if "id" in call:
            tool_call["id"] = call["id"]
        out.append(tool_call)
    if not out:
        raise ShapeError(f"turn {i} function_call holds an empty list of calls")
    return out


def convert(record: Any, options: ShapeOptions) -> Conversation:
    return sharegpt_conversation(record, options.fields, options.role_map)


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    """from/value turns under the usual conversation fields (`messages`, `conversation` too)."""
    found = conversation_field(record)
    if found is None or found[1] != "from":
        return None
    return Fit(() if found[0] == fields.messages else (("messages", found[0]),))


SPEC = ShapeSpec(
    name="sharegpt",
    fields={"messages": "conversations", "system": "system"},
    convert=convert,
    detect=detect,
    clues=("conversations", "messages", "conversation"),
    rank=50,
    chat=True,
    role_map=True,
)
