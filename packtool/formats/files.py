"""File records of a store: the `files` map {name: {bytes, sha256}} that manifests and metadata carry.

Writers record every file they wrote; readers check sizes always (cheap) and hashes on request.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from packtool.errors import FormatError

_HASH_BLOCK = 1 << 22


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, streamed in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_records(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """`{name: {bytes, sha256}}` of files in `directory`."""
    return {n: {"bytes": (directory / n).stat().st_size, "sha256": sha256_file(directory / n)} for n in names}


def check_file_records(
    directory: Path, files: object, required: list[str], *, check_hashes: bool, where: str, fix: str
) -> None:
    """Every `required` name is recorded, and every recorded file exists with its size (and hash).

    A missing or malformed `files` map is itself a FormatError: without it nothing can be checked.
    """
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
        for v in files.values()
    ):
        raise FormatError(f"the files map is missing or malformed, {where}, {fix}")
    absent = [n for n in required if n not in files]
    if absent:
        raise FormatError(f"the files map lacks {', '.join(absent)}, {where}, {fix}")
    for name, info in files.items():
        path = Path(directory) / name
        try:
            if not path.is_file() or path.stat().st_size != int(info["bytes"]):
                raise FormatError(
                    f"{name} does not match its recorded size (missing, truncated or replaced), {path}, {fix}"
                )
            if check_hashes and sha256_file(path) != info["sha256"]:
                raise FormatError(f"{name} sha256 differs from its record (corrupted), {path}, {fix}")
        except OSError as exc:  # unreadable, or replaced by a concurrent writer while we read it
            raise FormatError(f"{name} cannot be read ({exc.strerror or exc}), {path}, {fix}") from exc
