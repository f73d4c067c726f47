"""The exception hierarchy. Every message says what failed, where, and how to fix it.

The CLI turns any `PacktoolError` into ONE line `error: <message>` on stderr and exit
code 1 (2 for a `UsageError`); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PacktoolError(Exception):
    """Base class: a data, format or environment problem the user can fix."""


class InputError(PacktoolError):
    """A raw input record or file is malformed; carries the file and 1-based line."""

    def __init__(
        self, reason: str, source: str | None = None, line: int | None = None, hint: str | None = None
    ) -> None:
        self.reason = reason
        self.source = source
        self.line = line
        self.hint = hint
        where = ""
        if source is not None:
            where = f", {source}" + (f":{line}" if line is not None else "")
        fix = f", {hint}" if hint else ""
        super().__init__(f"{reason}{where}{fix}")


class FormatError(PacktoolError):
    """An on-disk store (token or pack) is corrupted, truncated, or of an unknown version."""


class ConfigError(PacktoolError):
    """A flag, config key or combination of options is invalid."""


class UsageError(ConfigError):
    """Flags that contradict each other or a value outside its domain: the CLI exits 2, as for a usage error."""


class TokenizerError(PacktoolError):
    """A tokenizer cannot be found or loaded, or does not match a store."""


class OutputExistsError(PacktoolError):
    """The output already holds a different store and `--overwrite` was not given."""


class StorageError(PacktoolError):
    """The output cannot be written: permissions, disk full, a read-only or special file system."""


class OutputLockedError(PacktoolError):
    """Another packtool run holds the output's lock (`packtool.formats.locks.exclusive_output`)."""
