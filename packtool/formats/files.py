"""File records of a store: the `files` map {name: {bytes, sha256}} that manifests and metadata carry.

Writers record every file they wrote; readers check sizes always (cheap) and hashes on request.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, BinaryIO

from packtool.errors import FormatError

HASH_BLOCK = 1 << 22


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, streamed in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


class HashedFile:
    """A file written front to back whose size and sha256 are kept as the bytes go by (never read back).

    `size` > 0 reopens an existing file cut to that size, `digest` being the sha256 state of those bytes."""

    def __init__(self, path: Path, digest: Any = None, size: int = 0) -> None:
        self.path = path
        self.fh: BinaryIO = open(path, "r+b" if size else "wb")  # noqa: SIM115 - closed by the writer
        if size:
            self.fh.truncate(size)
            self.fh.seek(size)
        self.digest = digest if digest is not None else hashlib.sha256()
        self.size = size

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")  # no copy: numpy arrays and bytes alike
        self.fh.write(view)
        self.digest.update(view)  # releases the GIL for large buffers, like the write
        self.size += view.nbytes


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
