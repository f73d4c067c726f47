"""Reopening a token store that a killed run was writing: keep what still checks out, continue from there.

A resumable writer (tokenize's staging store) journals a `StoreMark` after every unit of work:
each file's size and the sha256 of its bytes so far. `resume_token_store` re-hashes the files once,
keeps the longest run of marks they still match, cuts the files back to the last one and returns a
writer whose running hashes continue from it, so the finished manifest's sha256 is still that of
each whole file.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packtool.formats.files import HASH_BLOCK
from packtool.formats.media import MEDIA_FILES
from packtool.formats.token_store import BOUNDARIES, LOSS, REJECTS, TOKENS_BIN, StoreMark, TokenStoreWriter


def resume_token_store(
    directory: Path,
    dtype: np.dtype,
    marks: Sequence[StoreMark],
    *,
    with_loss: bool,
    with_rejects: bool,
    with_media: bool = False,
) -> tuple[TokenStoreWriter, int]:
    """Reopen a staging store at the last of `marks` (in write order) that its files still match.

    Each file is read once, up to the last mark, and hashed; a mark counts only when every file
    matches it, and so do all marks before it. The files are cut back to the kept mark and the writer
    continues from there. Returns (writer, number of marks kept); 0 means an empty, fresh store.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = [TOKENS_BIN, BOUNDARIES] + ([LOSS] if with_loss else []) + ([REJECTS] if with_rejects else [])
    names += list(MEDIA_FILES) if with_media else []  # a vision store's images resume with its tokens
    kept = len(marks)
    states: dict[str, list[Any]] = {}
    for name in names:
        states[name], good = _prefix_states(directory / name, [m.files.get(name) for m in marks])
        kept = min(kept, good)
    if kept == 0:
        for name in names:
            (directory / name).unlink(missing_ok=True)
        return TokenStoreWriter(
            directory, dtype, with_loss=with_loss, with_rejects=with_rejects, with_media=with_media
        ), 0
    digests = {n: states[n][kept - 1] for n in names}
    writer = TokenStoreWriter(
        directory,
        dtype,
        with_loss=with_loss,
        with_rejects=with_rejects,
        with_media=with_media,
        _resume=(marks[kept - 1], digests),
    )
    return writer, kept


def _prefix_states(path: Path, points: Sequence[tuple[int, str] | None]) -> tuple[list[Any], int]:
    """Hash `path` sequentially; the digest object at each point that matches, and how many match in a row."""
    states: list[Any] = []
    if not path.is_file():
        return states, 0
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as fh:
        for point in points:
            if point is None:
                break
            size, expected = point
            while done < size:
                block = fh.read(min(HASH_BLOCK, size - done))
                if not block:
                    return states, len(states)
                digest.update(block)
                done += len(block)
            if done != size or digest.hexdigest() != expected:
                break
            states.append(digest.copy())
    return states, len(states)
