"""LLaMA-Factory's ShareGPT ranking records (read by `--format preference` when the first record has
`conversations` of `{from, value}` turns and `chosen` / `rejected` turn objects).

LLaMA-Factory's own converter reads them so (`SharegptDatasetConverter`, `ranking: true`): a leading
`system` turn is the system prompt (else the top-level `system`); the turns alternate user/observation and
assistant/function_call and end on a user or observation turn; `chosen` and `rejected` are one
assistant or function_call turn each. A record that breaks these is skipped by LLaMA-Factory and is a bad
record here. TRL has no such shape, so the record becomes TRL's conversational explicit-prompt record:
prompt = the system prompt and the turns as messages (roles through sharegpt's map and `--role-map`,
a function_call turn an assistant message with `tool_calls`, an observation a `tool` message), chosen =
[the chosen turn], rejected = [the rejected turn], and the top-level `tools`.
"""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import Fit, Pair, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import (
    MISSING,
    as_object,
    conversation_field,
    required,
    structured,
    system_of,
    tools_of,
)
from packtool.core.encoding.shapes.preference import CHOSEN, REJECTED, present, text_only
from packtool.core.encoding.shapes.roles import role_table
from packtool.core.encoding.shapes.sharegpt import DEFAULT_ROLE_MAP, sharegpt_turn

#: the roles LLaMA-Factory accepts at even and odd positions of the conversation (after mapping)
_ASKING = ("user", "tool")


def convert(record: Any, options: ShapeOptions) -> Pair:
    record = text_only(as_object(record))
    fields = options.fields
    turns = structured(required(record, fields.messages, "the record"))
    if not isinstance(turns, list):
        raise ShapeError(f"field {fields.messages!r} is not a list of turns (got {type(turns).__name__})")
    table = role_table(options.role_map, DEFAULT_ROLE_MAP)
    messages = [sharegpt_turn(turn, i, table) for i, turn in enumerate(turns)]
    if messages and messages[0]["role"] == "system":
        system, messages = messages[:1], messages[1:]
    else:
        system = system_of(record, fields.system)
    for i, message in enumerate(messages):
        asking = i % 2 == 0
        if (message["role"] in _ASKING) != asking or message["role"] == "system":
            want = "a user or observation turn" if asking else "an assistant or function_call turn"
            raise ShapeError(
                f"turn {i + len(turns) - len(messages)} is a {message['role']} turn where LLaMA-Factory expects "
                f"{want} (turns alternate, ending on a user or observation turn)"
            )
    if len(messages) % 2 == 0:
        raise ShapeError(
            f"field {fields.messages!r} does not end on a user or observation turn ({len(messages)} turns after the "
            "system prompt), LLaMA-Factory skips such a ranking record"
        )
    completions = []
    for name in (CHOSEN, REJECTED):
        turn = structured(present(record, name))
        if not isinstance(turn, dict):
            got = "nothing" if turn is MISSING else type(turn).__name__
            raise ShapeError(f"field {name!r} is not a {{from, value}} turn object (got {got})")
        message = sharegpt_turn(turn, name, table)
        if message["role"] != "assistant":
            raise ShapeError(
                f"field {name!r} is a {turn.get('from')!r} turn, LLaMA-Factory expects an assistant or function_call turn"
            )
        completions.append([message])
    return Pair([*system, *messages], completions[0], completions[1], tools_of(record, fields.tools))


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    found = conversation_field(record)
    if found is None or found[1] != "from":
        return None
    if not all(isinstance(structured(present(record, name)), dict) for name in (CHOSEN, REJECTED)):
        return None
    return Fit(() if found[0] == fields.messages else (("messages", found[0]),))


SPEC = ShapeSpec(
    name="ranking-sharegpt",
    fields={"messages": "conversations", "system": "system"},
    convert=convert,
    detect=detect,
    clues=("chosen/rejected",),
    rank=70,
    chat=True,
    role_map=True,
    pairs=True,
)
