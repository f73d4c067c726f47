"""The one list of input readers: every source kind packtool reads is one line below.

Suffix lists, the CLI help of `tokenize`'s INPUT argument, the hub's file families and the error
texts that name the readable kinds are derived from this list, and `tests/test_input_readers.py`
ties it to what it must cover. The modules are imported on first use (they are light: their
heavy machinery is imported inside `plan` and `read`). A module's `READERS` holds its kinds (a
format and its compressed variants).

Adding a source kind: a module beside the others whose `READERS` implement `base.Reader`, its
test, and its line here (docs/ARCHITECTURE.md walks through the CSV/TSV reader as the example).
"""

from __future__ import annotations

import importlib
import os
from functools import cache

from packtool.errors import InputError
from packtool.stages.tokenize.inputs.readers.base import Reader

_MODULES = (
    "packtool.stages.tokenize.inputs.readers.jsonl",
    "packtool.stages.tokenize.inputs.readers.json_array",
    "packtool.stages.tokenize.inputs.readers.parquet",
    "packtool.stages.tokenize.inputs.readers.arrow",
    "packtool.stages.tokenize.inputs.readers.txt",
    "packtool.stages.tokenize.inputs.readers.delimited",
)
#: compressed variants of a suffix, shown grouped in texts: `.jsonl(.gz|.zst)`
_COMPRESSED = (".gz", ".zst")


@cache
def readers() -> tuple[Reader, ...]:
    """Every reader, in the registry's order; kinds and suffixes are unique (a clash is a bug, raised here)."""
    found: list[Reader] = [r for name in _MODULES for r in importlib.import_module(name).READERS]
    kinds = [r.kind for r in found]
    suffixes = [s for r in found for s in r.suffixes]
    if len(set(kinds)) != len(kinds) or len(set(suffixes)) != len(suffixes):
        raise RuntimeError(f"input readers clash: kinds {kinds}, suffixes {suffixes}")
    return tuple(found)


@cache
def _by_kind() -> dict[str, Reader]:
    return {r.kind: r for r in readers()}


@cache
def _by_suffix() -> tuple[tuple[str, Reader], ...]:
    """(suffix, reader), longest suffix first: `.jsonl.gz` before `.gz` would be."""
    return tuple(sorted(((s, r) for r in readers() for s in r.suffixes), key=lambda sr: -len(sr[0])))


def reader_for(path: str | os.PathLike[str]) -> Reader | None:
    """The reader of a file, chosen by its name's ending (case-insensitive), or None."""
    name = os.fspath(path).lower()
    return next((r for suffix, r in _by_suffix() if name.endswith(suffix)), None)


def reader_named(kind: str) -> Reader:
    """The reader of a chunk kind (`Chunk.kind`)."""
    try:
        return _by_kind()[kind]
    except KeyError:
        raise InputError(f"unknown chunk kind {kind!r}", None, hint="this is a bug") from None


def suffix_text() -> str:
    """The readable suffixes for help and errors, compressed variants grouped: `.jsonl(.gz|.zst), .json, ...`."""
    groups: dict[str, list[str]] = {}
    for suffix in (s for r in readers() for s in r.suffixes):
        base = next(
            (suffix[: -len(c)] for c in _COMPRESSED if suffix.endswith(c) and suffix[: -len(c)] in groups), None
        )
        if base is None:
            groups.setdefault(suffix, [])
        else:
            groups[base].append(suffix[len(base) :])
    return ", ".join(base + (f"({'|'.join(variants)})" if variants else "") for base, variants in groups.items())


def suffix_list() -> str:
    """Every readable suffix: `.jsonl, .jsonl.gz, ... or .txt`."""
    every = [s for r in readers() for s in r.suffixes]
    return ", ".join(every[:-1]) + f" or {every[-1]}"
