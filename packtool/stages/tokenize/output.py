"""The tokenize output: one writer at a time, repair of a killed swap, and what `--overwrite` may replace.

`guarded_output` wraps the whole write phase of a run: it takes the output's lock (a second run
fails with one line naming the holder), repairs a swap that a killed run left (so the final name
holds the old store or the new one, never nothing), and turns an OSError of the output side
(permissions, disk full, read-only or special file system) into one `StorageError` line.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from packtool.errors import OutputExistsError, StorageError
from packtool.formats import jsontext
from packtool.formats.atomic import directories_made
from packtool.formats.locks import exclusive_output
from packtool.formats.oserrors import writing
from packtool.formats.overwrite import check_replaceable
from packtool.formats.token_store import MANIFEST, recover_token_store

log = logging.getLogger(__name__)


@contextlib.contextmanager
def guarded_output(output: Path) -> Iterator[None]:
    """Hold `output`'s lock for the block, repair a killed swap first, name output-side OSErrors.

    Parent directories it creates are removed again when the run fails and leaves them empty.
    """
    with writing(output):
        for parent in output.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise StorageError(
                        f"cannot write the output, {parent} is a file, not a directory, choose another --output"
                    )
                break
        with directories_made(output.parent), exclusive_output(output):  # one holding .DIR.partial stays
            done = recover_token_store(output)
            if done:
                log.warning("%s", done)
            yield


def check_output(output: Path, build: str, overwrite: bool, inputs: Sequence[Path]) -> dict[str, Any] | None:
    """The existing manifest if `output` already is this very store; raise if it holds something else."""
    if not output.exists():
        return None
    if not output.is_dir():
        raise OutputExistsError(f"output {output} exists and is not a directory, choose another --output or remove it")
    manifest = None
    if (output / MANIFEST).is_file():
        try:
            manifest = jsontext.loads((output / MANIFEST).read_text("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            manifest = None
    if isinstance(manifest, dict) and manifest.get("build") == build and not overwrite:
        return manifest
    if not any(output.iterdir()):
        return None
    if not overwrite:
        raise OutputExistsError(
            f"output {output} already holds a different token store (or other files), "
            "pass --overwrite to replace it (a token store only) or choose another --output"
        )
    check_replaceable(output, inputs)
    return None
