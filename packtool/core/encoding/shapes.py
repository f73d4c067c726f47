"""Record shapes -> a conversation (messages, tools, where targets start): pure functions, one per shape.

Every chat-like shape becomes the messages transformers' `apply_chat_template` takes, then follows
the one chat path (`chat.render_with_spans`), so ids, targets, `--assistant-turns` and both
backends behave exactly as for `--format chat`:
- chat: `messages` of `{role, content, ...}` as given (roles renamed by `--role-map` if one is given),
  top-level `tools` to the template as `tools=` (TRL and OpenAI's fine-tuning files put them there);
- sharegpt: `conversations` of `{from, value}`; roles through `DEFAULT_ROLE_MAP` (plus `--role-map`),
  matched whatever their case and surrounding space (`Human`, `GPT`: exports in the wild have them);
  a `function_call` turn is an assistant message whose `tool_calls` come from its JSON value; a
  top-level `system` string is the first message; top-level `tools` go to the template as `tools=`;
- alpaca (LLaMA-Factory's convention): system, the `history` pairs, user = the non-empty of
  `instruction` and `input` joined by "\\n", assistant = `output`;
- TRL's conversational prompt-completion: `prompt` + `completion` lists of messages, targets only
  in the completion.
A conversation is rendered as the data says (a model-first turn, two turns of one role): refusing
one is the template's call. Nothing is dropped: a turn's extra keys stay on its message, and every
problem (unknown role, missing or non-string `value`, unparseable `function_call`, empty
conversation, missing `output`) is a `ShapeError` naming the turn, i.e. a per-record error.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packtool.core.encoding.turns import ChatRecordError

#: the roles a message may have after mapping (transformers' chat roles)
TARGET_ROLES = ("system", "user", "assistant", "tool")
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
RoleMap = tuple[tuple[str, str], ...]  # (from, to) pairs: hashable and picklable for the chunk settings


class ShapeError(ChatRecordError):
    """A record that does not have its shape (a per-record error: file:line, or rejects.jsonl)."""


@dataclass(frozen=True)
class Conversation:
    """What the chat path renders: messages, the template's `tools=`, and the first message that may be a target."""

    messages: list[dict[str, Any]]
    tools: list[Any] | None = None
    targets_from: int = 0  # assistant messages before this index are context, not targets (TRL prompt)


@dataclass(frozen=True)
class ShapeFields:
    """The record fields each shape reads (defaults: the shapes' usual names)."""

    messages: str = "messages"  # chat; sharegpt reads "conversations" unless overridden
    prompt: str = "prompt"
    completion: str = "completion"
    instruction: str = "instruction"
    input: str = "input"
    output: str = "output"
    system: str = "system"
    history: str = "history"
    tools: str = "tools"


def role_key(name: str) -> str:
    """How a role name is matched: case and surrounding space ignored (`Human`, ` GPT ` are `human`, `gpt`)."""
    return name.strip().casefold()


def parse_role_map(spec: str) -> RoleMap:
    """`from=to,from2=to2` -> pairs; ValueError with the reason when malformed or a target is not a role."""
    pairs: list[tuple[str, str]] = []
    for piece in spec.split(","):
        name, eq, role = (s.strip() for s in piece.partition("="))
        if not eq or not name or not role:
            raise ValueError(f"{piece.strip()!r} is not FROM=TO (e.g. --role-map 'human=user,gpt=assistant')")
        if role not in TARGET_ROLES:
            raise ValueError(f"{name}={role}: {role!r} is not one of {', '.join(TARGET_ROLES)}")
        if any(role_key(name) == role_key(seen) for seen, _ in pairs):
            raise ValueError(f"{name!r} is mapped twice (role names match whatever their case)")
        pairs.append((name, role))
    return tuple(pairs)


def role_table(extra: RoleMap, base: Mapping[str, str] = DEFAULT_ROLE_MAP) -> dict[str, str]:
    """`base` overridden and extended by `extra`, keyed by `role_key` (look names up through it too)."""
    table = {role_key(k): v for k, v in base.items()}
    table.update((role_key(k), v) for k, v in extra)
    return table


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ShapeError(f"{what} is not a string (got {type(value).__name__})")
    return value


_MISSING = object()


def _get(record: Any, dotted: str) -> Any:
    """A (dotted) field of a record, or _MISSING."""
    current = record
    for key in dotted.split("."):
        if not isinstance(current, dict) or key not in current:
            return _MISSING
        current = current[key]
    return current


def _field(record: dict[str, Any], name: str, what: str) -> Any:
    value = _get(record, name)
    if value is _MISSING:
        raise ShapeError(f"{what} has no {name!r} field")
    return value


def _optional(record: dict[str, Any], name: str) -> Any:
    """An optional field; a null counts as absent."""
    value = _get(record, name)
    return None if value is _MISSING else value


def _object(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ShapeError(f"the record is not a JSON object (got {type(record).__name__})")
    return record


def _tools(record: dict[str, Any], name: str) -> list[Any] | None:
    """Top-level tools: a list of tool schemas, or a JSON string of one (LLaMA-Factory stores them so)."""
    tools = _optional(record, name)
    if isinstance(tools, str):
        if not tools.strip():
            return None
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise ShapeError(f"field {name!r} is a string that is not JSON ({exc.msg} at {exc.pos})") from None
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ShapeError(f"field {name!r} is not a list of tool objects (got {type(tools).__name__})")
    return tools  # an empty list stays one: transformers passes `tools=[]` as given


def _system(record: dict[str, Any], name: str) -> list[dict[str, Any]]:
    system = _optional(record, name)
    if system is None or system == "":  # absent, as in LLaMA-Factory (a table's empty cell is no system prompt)
        return []
    return [{"role": "system", "content": _text(system, f"field {name!r}")}]


def chat_conversation(
    messages: Any, role_map: RoleMap = (), record: Any = None, tools_field: str = "tools"
) -> Conversation:
    """`--format chat`: the messages as given, the record's top-level `tools` (as TRL passes them); with a role
    map, roles renamed (unmapped roles kept)."""
    if role_map and isinstance(messages, list):
        table = role_table(role_map, {})
        messages = [_renamed(m, table) for m in messages]
    return Conversation(messages, _tools(record, tools_field) if isinstance(record, dict) else None)


def _renamed(message: Any, table: dict[str, str]) -> Any:
    """A chat message with its role through `--role-map` (a role the map does not name is kept as given)."""
    role = message.get("role") if isinstance(message, dict) else None
    mapped = table.get(role_key(role)) if isinstance(role, str) else None
    return message if mapped is None else {**message, "role": mapped}


def sharegpt_conversation(record: Any, fields: ShapeFields, role_map: RoleMap = ()) -> Conversation:
    """`--format sharegpt`: `{from, value}` turns through the role map (see the module docstring)."""
    record = _object(record)
    turns = _field(record, fields.messages, "the record")
    if not isinstance(turns, list):
        raise ShapeError(f"field {fields.messages!r} is not a list of turns (got {type(turns).__name__})")
    if not turns:
        raise ShapeError(f"empty conversation (field {fields.messages!r} holds no turns)")
    table = role_table(role_map)
    messages = _system(record, fields.system)
    for i, turn in enumerate(turns):
        messages.append(_sharegpt_turn(turn, i, table))
    return Conversation(messages, _tools(record, fields.tools))


def _sharegpt_turn(turn: Any, i: int, table: dict[str, str]) -> dict[str, Any]:
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
    value = _text(turn["value"], f"turn {i} ({name}) 'value'")
    extra = {k: v for k, v in turn.items() if k not in ("from", "value") and v is not None}  # null = absent (Arrow)
    clash = sorted(k for k in extra if k in ("role", "content") or (role == FUNCTION_CALL and k == "tool_calls"))
    if clash:
        raise ShapeError(f"turn {i} has both 'from'/'value' and {', '.join(map(repr, clash))}, keep one of them")
    if role == FUNCTION_CALL:
        return {"role": "assistant", "tool_calls": _tool_calls(value, i), **extra}
    return {"role": role, "content": value, **extra}


def _tool_calls(value: str, i: int) -> list[dict[str, Any]]:
    """A function_call turn's JSON: one `{name, arguments}` object (or a list of them) -> transformers' tool_calls."""
    try:
        parsed = json.loads(value)
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


def alpaca_conversation(record: Any, fields: ShapeFields) -> Conversation:
    """`--format alpaca` (LLaMA-Factory's convention, see the module docstring)."""
    record = _object(record)
    output = _text(_field(record, fields.output, "the Alpaca record"), f"field {fields.output!r}")
    instruction = _text(_field(record, fields.instruction, "the Alpaca record"), f"field {fields.instruction!r}")
    given = _optional(record, fields.input)
    query = "" if given is None else _text(given, f"field {fields.input!r}")
    messages = _system(record, fields.system)
    history = _optional(record, fields.history)
    if history is not None:
        if not isinstance(history, list):
            raise ShapeError(f"field {fields.history!r} is not a list of [user, assistant] pairs")
        for k, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
                raise ShapeError(f"{fields.history}[{k}] is not a [user, assistant] pair of strings")
            messages += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    user = "\n".join(part for part in (instruction, query) if part)
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": output}]
    return Conversation(messages)


def conversational_prompt_completion(record: Any, fields: ShapeFields) -> Conversation:
    """TRL's conversational prompt-completion: targets are the completion's assistant turns only."""
    record = _object(record)
    parts = []
    for name in (fields.prompt, fields.completion):
        messages = _field(record, name, "the record")
        if not isinstance(messages, list):
            raise ShapeError(
                f"field {name!r} is not a list of messages (got {type(messages).__name__}), but the first records "
                "hold lists (TRL's conversational prompt-completion): make every record alike"
            )
        parts.append(messages)
    if not parts[1]:
        raise ShapeError(f"field {fields.completion!r} is an empty list of messages")
    return Conversation(parts[0] + parts[1], _tools(record, fields.tools), targets_from=len(parts[0]))


#: where conversations are found, in this order: `messages` (OpenAI, TRL), `conversations` (ShareGPT),
#: `conversation` (LMSYS-Chat-1M, WildChat)
CONVERSATION_FIELDS = ("messages", "conversations", "conversation")
_DEFAULT_FIELD = {"chat": "messages", "sharegpt": "conversations"}


def detect_shape(record: Any) -> str | None:
    """The shape of one record by its default field names, or None when none fits.

    Returns text, prompt-completion, conversational-prompt-completion, alpaca, or a conversation shape: chat
    (role/content turns) or sharegpt (from/value turns), with `:FIELD` when the turns are not under that
    shape's default field (`chat:conversations`, `sharegpt:messages`, `chat:conversation`, ...).
    """
    if not isinstance(record, dict):
        return None
    for field in CONVERSATION_FIELDS:
        turns = record.get(field)
        if isinstance(turns, list) and turns and all(isinstance(t, dict) for t in turns):
            kind = (
                "sharegpt" if all("from" in t for t in turns) else "chat" if all("role" in t for t in turns) else None
            )
            if kind is not None:
                return kind if field == _DEFAULT_FIELD[kind] else f"{kind}:{field}"
    prompt, completion = record.get("prompt"), record.get("completion")
    if isinstance(prompt, list) and isinstance(completion, list):
        return "conversational-prompt-completion"
    if isinstance(prompt, str) and isinstance(completion, str):
        return "prompt-completion"
    if "instruction" in record and "output" in record:
        return "alpaca"
    if isinstance(record.get("text"), str):
        return "text"
    return None
