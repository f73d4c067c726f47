"""The contract of a locator: one kind of input argument -> the files it names, with their sort keys.

Locators are tried in the order of `locators.LOCATORS`; the first that `claims` an argument
`locate`s it. A file's sort key (the argument's path text, and a position for the files of one
`save_to_disk` directory) orders all inputs: sorted paths, a dataset's files in `state.json`'s
order at the directory's place. Every locator yields only files some reader reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from packtool.stages.tokenize.inputs.readers.registry import reader_for

#: file -> sort key (path text, position inside a `save_to_disk` directory or -1)
Found = dict[Path, tuple[str, int]]


class Locator(Protocol):
    @property
    def name(self) -> str: ...

    def claims(self, text: str) -> bool: ...

    def locate(self, text: str) -> Found: ...


def norm(path: Path) -> Path:
    """The resolved path, or, when a link's target is named otherwise (a hub snapshot's files link
    to blobs named by hash), the absolute path of the link: the reader is picked by the name."""
    resolved = path.resolve()
    return resolved if reader_for(resolved) is reader_for(path) else path.parent.resolve() / path.name


def plain(path: Path) -> Found:
    """One file, keyed by its own path."""
    path = norm(path)
    return {path: (str(path), -1)}
