"""Reading a record's fields: dotted paths, required and optional values, and the parts several shapes share
(the top-level `tools` and `system` prompt, where a conversation's turns are).

One rule names a field in every input (jsonl, CSV, parquet, Arrow): a name is the record's key of that
name when the record has one, literally, dots and all (`meta.text`, the column `pandas.json_normalize`
writes); otherwise each dot steps into an object (`meta.text`: the key `text` of the object `meta`). A
record holding both a `meta.text` key and a `meta` object reads the `meta.text` key.

A null counts as absent wherever a field is optional: Arrow and parquet tables give every row every
column, and `datasets` gives every turn every key of any turn.
"""

from __future__ import annotations

import json
from typing import Any

from packtool.core.encoding.shapes.base import ShapeError
from packtool.formats import jsontext

#: where conversations are found, in this order: `messages` (OpenAI, TRL), `conversations` (ShareGPT),
#: `conversation` (LMSYS-Chat-1M, WildChat)
CONVERSATION_FIELDS = ("messages", "conversations", "conversation")
#: the key naming a turn's speaker: ShareGPT's `from` before chat's `role` (a turn with both is ShareGPT's)
SPEAKER_KEYS = ("from", "role")
MISSING: Any = object()


class JsonText(str):
    """A string that may hold a JSON array or object: a CSV cell whose first non-space character is `[` or
    `{`. It is the text written where a shape reads text (an Alpaca `input` of `[4, 21, 11]` stays those
    characters) and the value it holds where a shape reads a list or an object (`structured`)."""

    __slots__ = ()


def structured(value: Any) -> Any:
    """`value`, or the JSON value a `JsonText` holds (one that does not parse stays its text)."""
    if type(value) is not JsonText:
        return value
    try:
        return jsontext.loads(value)
    except ValueError:
        return str(value)


def plain_text(value: str) -> str:
    """A string as the tokenizer and template get it: a `JsonText` as a plain `str`."""
    return str(value) if type(value) is JsonText else value


def get_field(value: Any, dotted: str) -> tuple[Any, str | None]:
    """Walk a dotted path (`a.b.c`) through nested dicts: (value, None) or (None, reason)."""
    if isinstance(value, dict) and dotted in value:  # the common case, and a literal `a.b` key (see above)
        return value[dotted], None
    current = value
    for depth, key in enumerate(dotted.split(".")):
        current = structured(current) if depth else current  # a dotted path reaches into a JSON cell
        if not isinstance(current, dict):
            where = ".".join(dotted.split(".")[:depth]) or "record"
            return None, f"{where} is not an object (got {type(current).__name__}), cannot read field {dotted!r}"
        if key not in current:
            return None, f"missing field {dotted!r}{_near(current, key)}"
        current = current[key]
    return current, None


def _near(record: dict[Any, Any], key: str) -> str:
    """` (the record has ' text' ...)` when a key differs from `key` only by surrounding space or case (a CSV
    header written `id, text`), else nothing; a bounded look (a record may have 100,000 keys)."""
    if len(record) > 10_000:
        return ""
    want = key.strip().casefold()
    close = [k for k in record if isinstance(k, str) and k != key and k.strip().casefold() == want]
    return f" (the record has {close[0]!r}: names match exactly, spaces and case included)" if close else ""


def get_text_field(value: Any, dotted: str) -> tuple[str | None, str | None]:
    """A dotted field that must be a string: (text, None) or (None, reason)."""
    got, reason = get_field(value, dotted)
    if reason is not None:
        return None, reason
    if not isinstance(got, str):
        return None, f"field {dotted!r} is not a string (got {type(got).__name__})"
    return plain_text(got), None


def lookup(record: Any, dotted: str) -> Any:
    """A (dotted) field of a record, or MISSING (a literal key first, as `get_field`)."""
    if isinstance(record, dict) and dotted in record:
        return record[dotted]
    current = record
    for depth, key in enumerate(dotted.split(".")):
        current = structured(current) if depth else current  # a dotted path reaches into a JSON cell
        if not isinstance(current, dict) or key not in current:
            return MISSING
        current = current[key]
    return current


def required(record: dict[str, Any], name: str, what: str) -> Any:
    value = lookup(record, name)
    if value is MISSING:
        raise ShapeError(f"{what} has no {name!r} field")
    return value


def optional(record: dict[str, Any], name: str) -> Any:
    """An optional field; a null counts as absent."""
    value = lookup(record, name)
    return None if value is MISSING else value


def as_object(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ShapeError(f"the record is not a JSON object (got {type(record).__name__})")
    return record


def text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ShapeError(f"{what} is not a string (got {type(value).__name__})")
    return plain_text(value)


def tools_of(record: dict[str, Any], name: str) -> list[Any] | None:
    """Top-level tools: a list of tool schemas, or a JSON string of one (LLaMA-Factory stores them so)."""
    tools = optional(record, name)
    if isinstance(tools, str):
        if not tools.strip():
            return None
        try:
            tools = jsontext.loads(tools)
        except json.JSONDecodeError as exc:
            raise ShapeError(f"field {name!r} is a string that is not JSON ({exc.msg} at {exc.pos})") from None
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ShapeError(f"field {name!r} is not a list of tool objects (got {type(tools).__name__})")
    return tools  # an empty list stays one: transformers passes `tools=[]` as given


def system_of(record: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """A top-level system prompt as the first message ([] when absent or empty: a table's empty cell)."""
    system = optional(record, name)
    if system is None or system == "":
        return []
    return [{"role": "system", "content": text(system, f"field {name!r}")}]


def conversation_field(record: Any) -> tuple[str, str] | None:
    """(field, speaker key) of the first usual conversation field holding a non-empty list of turns that all
    name their speaker with the same key (`from` or `role`), or None (`--format auto`)."""
    if not isinstance(record, dict):
        return None
    for field in CONVERSATION_FIELDS:
        turns = structured(record.get(field))
        if isinstance(turns, list) and turns and all(isinstance(t, dict) for t in turns):
            for key in SPEAKER_KEYS:
                if all(key in t for t in turns):
                    return field, key
    return None
