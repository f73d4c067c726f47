"""Small files read whole (settings, templates, file lists): only regular files, and never more than their
kind ever holds.

A `tokenizer_config.json`, a chat template, a model's `config.json` or a `save_to_disk` `state.json` is
read in one piece, so a link to `/dev/zero` or a FIFO never ends (a MemoryError traceback after
gigabytes) and a multi-gigabyte file is a mistake, not a setting. Each reader names its kind's limit;
the refusal says why the file was not read, and the caller turns it into its own one-line error.
"""

from __future__ import annotations

import stat
from pathlib import Path


class SideFileError(ValueError):
    """Why a side file was not read (not a regular file, or larger than its kind holds)."""


def read_side_file(path: Path, limit: int) -> bytes:
    """The bytes of `path` when it is a regular file (links followed) of at most `limit` bytes.

    SideFileError otherwise, before anything is read; OSError (missing, unreadable) as the OS says."""
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        raise SideFileError("it is not a regular file (a device, a FIFO or a socket is never read)")
    size = path.stat().st_size
    if size > limit:
        raise SideFileError(f"it is {size:,} bytes, more than such a file holds ({limit:,})")
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:  # it grew meanwhile
        raise SideFileError(f"it is more than {limit:,} bytes, more than such a file holds")
    return data
