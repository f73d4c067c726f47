"""Choices and frozen configs shared by the library, the CLI and `packtool run`.

Every CLI flag has the same name as a config key (dashes become underscores), so a YAML
file for `packtool run` is just the flags written down.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A str-valued Enum that typer shows as its choices (stdlib StrEnum is 3.11+)."""

    def __str__(self) -> str:
        return str(self.value)


class InputFormat(StrEnum):
    TEXT = "text"
    PROMPT_COMPLETION = "prompt-completion"
    CHAT = "chat"


class OnError(StrEnum):
    FAIL = "fail"
    SKIP = "skip"


class Algorithm(StrEnum):
    FFD = "ffd"
    BFD = "bfd"
    MFFD = "mffd"
    FFS = "ffs"
    CONCAT = "concat"


class Overlong(StrEnum):
    TRUNCATE = "truncate"
    SPLIT = "split"
    DROP = "drop"
    ERROR = "error"


class Split(StrEnum):
    TRAINING = "training"
    VALIDATION = "validation"
    TEST = "test"
