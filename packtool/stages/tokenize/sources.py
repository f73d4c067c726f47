"""Field access on a record (`get_field`, `get_text_field`): the record shapes' side, which is moving them.

Everything else this module held (path expansion, chunk planning, hashing, record reading) now lives
in the input room, `packtool.stages.tokenize.inputs`. `Chunk` and `read_chunk` are re-exported here
only for `shape.py`, which the record shapes' branch owns: at the merge, its import moves to
`packtool.stages.tokenize.inputs` and this module goes with `get_field`.
"""

from __future__ import annotations

from typing import Any

from packtool.stages.tokenize.inputs.chunk import Chunk
from packtool.stages.tokenize.inputs.plan import read_chunk

__all__ = ["Chunk", "get_field", "get_text_field", "read_chunk"]


def get_field(value: Any, dotted: str) -> tuple[Any, str | None]:
    """Walk a dotted path (`a.b.c`) through nested dicts: (value, None) or (None, reason)."""
    if type(value) is dict and dotted in value and "." not in dotted:  # the common case: no split
        return value[dotted], None
    current = value
    for depth, key in enumerate(dotted.split(".")):
        if not isinstance(current, dict):
            where = ".".join(dotted.split(".")[:depth]) or "record"
            return None, f"{where} is not an object (got {type(current).__name__}), cannot read field {dotted!r}"
        if key not in current:
            return None, f"missing field {dotted!r}"
        current = current[key]
    return current, None


def get_text_field(value: Any, dotted: str) -> tuple[str | None, str | None]:
    """A dotted field that must be a string: (text, None) or (None, reason)."""
    got, reason = get_field(value, dotted)
    if reason is not None:
        return None, reason
    if not isinstance(got, str):
        return None, f"field {dotted!r} is not a string (got {type(got).__name__})"
    return got, None
