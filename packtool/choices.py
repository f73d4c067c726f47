"""Every closed set of choices, as StrEnums: typer shows them as choices, `packtool run` checks them.

The bottom layer (with `errors`): any layer may import it, it imports nothing of packtool.
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A str-valued Enum that typer shows as its choices (stdlib StrEnum is 3.11+)."""

    def __str__(self) -> str:
        return str(self.value)


class InputFormat(StrEnum):
    """`--format`, and the registry of record shapes: every value but `auto` names the shape whose spec is
    `SPEC` in `packtool/core/encoding/shapes/<value, dashes as underscores>.py` (read by
    `core.encoding.shapes.registry`). Adding a shape is its module plus one line here (docs/ARCHITECTURE.md)."""

    TEXT = "text"
    PROMPT_COMPLETION = "prompt-completion"
    CHAT = "chat"
    SHAREGPT = "sharegpt"
    ALPACA = "alpaca"
    OPENAI = "openai"
    PREFERENCE = "preference"
    AUTO = "auto"


class AssistantTurns(StrEnum):
    """Which assistant turns of a chat are loss targets."""

    ALL = "all"
    LAST = "last"


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


class ExecutorName(StrEnum):
    LOCAL = "local"
    RAY = "ray"


class BackendName(StrEnum):
    AUTO = "auto"
    HF = "hf"
    FAST = "fast"


class ExportTarget(StrEnum):
    """The trainer whose format `--to` selects."""

    MEGATRON_BRIDGE = "megatron-bridge"
    NEMO = "nemo"
    TRL = "trl"
    OLMO_CORE = "olmo-core"


class AttentionBackend(StrEnum):
    """Which kernel `packtool.attention.varlen_attention` runs (`auto`: the first usable of flash, native, fallback)."""

    AUTO = "auto"
    FLASH = "flash"
    FLASH2 = "flash2"
    FLASH3 = "flash3"
    FLASH4 = "flash4"
    NATIVE = "native"
    FALLBACK = "fallback"
