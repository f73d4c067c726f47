"""Locators: an input argument -> the files it names (`base.Locator`), tried in the order of `LOCATORS`.

`expand_inputs` turns every argument into files and orders them: sorted paths, a `save_to_disk`
directory's files in `state.json`'s order at the directory's place, each file once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from packtool.errors import InputError
from packtool.formats.oserrors import reading
from packtool.stages.tokenize.inputs.locators.base import Found, Locator
from packtool.stages.tokenize.inputs.locators.files import DirectoryLocator, FileLocator, GlobLocator, kinds_text
from packtool.stages.tokenize.inputs.locators.hub import HubLocator, HubOptions
from packtool.stages.tokenize.inputs.locators.saved import SavedDatasetLocator

#: the first locator that claims an argument locates it: the hub's prefix, then what exists on disk, then a glob
LOCATORS: tuple[Locator, ...] = (HubLocator(), SavedDatasetLocator(), DirectoryLocator(), FileLocator(), GlobLocator())


def expand_inputs(inputs: Sequence[str | os.PathLike[str]], hub: HubOptions | None = None) -> list[Path]:
    """Files, directories (recursive), globs and `hf://datasets/...` -> sorted, de-duplicated input files.

    The order is the sorted path order, except that a `save_to_disk` directory's files keep
    `state.json`'s order (they sort as the directory's own path). `hub`: the subset and split of the hub
    inputs, the progress of their download, and where each records what it resolved to."""
    locators = LOCATORS if hub is None else (HubLocator(hub), *LOCATORS[1:])
    if not inputs:
        raise InputError("no input given", hint=f"pass files, directories or globs of {kinds_text()}")
    found: Found = {}
    for item in inputs:
        text = os.fspath(item)
        if not text.strip():  # Path("") is ".": an unset shell variable must not read the working directory
            raise InputError(
                "an input argument is empty (an unset shell variable?)",
                repr(text),
                hint=f"pass files, directories or globs of {kinds_text()}",
            )
        with reading(text):  # a directory on the way that cannot be listed, etc.
            locator = next(loc for loc in locators if loc.claims(text))
            found.update(locator.locate(text))
    return sorted(found, key=lambda p: found[p])
