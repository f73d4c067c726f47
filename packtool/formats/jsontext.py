"""JSON text from a file or a record, parsed so that every way it can fail is a `json.JSONDecodeError`.

Python's `json` recurses once per nesting level: a manifest, a metadata line, a journal line, a
tokenizer side file or a record's JSON-string field (`tools`, a ShareGPT `function_call`) holding
100,000 `[` raised `RecursionError`, which no reader caught (a traceback). Every reader of JSON
that data can hold parses it here and keeps its own `except json.JSONDecodeError` (the error it
already turns into one line). orjson, used for records on the hot path, stops at 1,024 levels by
itself.
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """`json.loads(text)`; nesting deeper than the interpreter can follow is a JSONDecodeError too."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deep to read", "", 0) from None
