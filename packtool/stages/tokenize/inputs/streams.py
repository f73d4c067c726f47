"""Raw input bytes -> pieces cut at a separator, with bounded memory and truncation checks.

Every input is read as a stream of blocks (`_BLOCK` bytes) and cut at a separator (a newline
for jsonl, `--separator` for .txt). A record longer than `max_record_bytes` is never held in
memory: once the pending piece passes the limit it is dropped and the reader skips to the next
separator, reporting a `TooLong` in its place (a bad record with file:line). Peak memory per
reader is about 2 x limit + one block, whatever the size of a line.

Compressed inputs must be complete: a `.gz` whose last member ends early raises EOFError in
`gzip`; a `.zst` is checked frame by frame (header, block headers, checksum) before it is
decompressed, because zstandard's stream reader returns a cut frame's data without an error.
A file cut exactly between two complete frames (or gzip members) is itself a valid file; no
reader can tell it from a complete one.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from packtool.errors import InputError
from packtool.formats.oserrors import reading

_BLOCK = 1 << 22
_TRUNCATED_HINT = "check that the file is complete (re-download or re-compress it)"


@dataclass(frozen=True)
class TooLong:
    """A record longer than the limit, skipped unread; `newlines` inside it keep line numbers right."""

    n_bytes: int
    newlines: int


def split_records(blocks: Iterator[bytes], sep: bytes, limit: int) -> Iterator[bytes | TooLong]:
    """Cut a block stream at `sep`; yield each piece (the last one even if empty) or a `TooLong`."""
    carry = b""
    skipped = -1  # bytes of an over-long piece dropped so far; -1: not skipping
    skipped_nl = 0
    keep = len(sep) - 1  # bytes that may start a separator cut by a block boundary
    for block in blocks:
        buf = carry + block if carry else block
        if skipped >= 0:
            i = buf.find(sep)
            if i < 0:
                drop = len(buf) - keep
                skipped, skipped_nl = skipped + drop, skipped_nl + buf.count(b"\n", 0, drop)
                carry = buf[drop:]
                continue
            yield TooLong(skipped + i, skipped_nl + buf.count(b"\n", 0, i))
            skipped, skipped_nl = -1, 0
            buf = buf[i + len(sep) :]
        pieces = buf.split(sep)
        rest = pieces.pop()
        for piece in pieces:
            yield piece if len(piece) <= limit else TooLong(len(piece), piece.count(b"\n"))
        if len(rest) > limit + keep:  # longer than the limit even if its tail starts a separator
            drop = len(rest) - keep
            skipped, skipped_nl = drop, rest.count(b"\n", 0, drop)
            carry = rest[drop:]
        else:
            carry = rest
    if skipped >= 0:
        yield TooLong(skipped + len(carry), skipped_nl + carry.count(b"\n"))
    else:
        yield carry


def blocks(path: str, compression: str, start: int = 0, end: int = -1) -> Iterator[bytes]:
    """The bytes a reader reads: `start:end` of a plain file, or the whole of a `"gz"` / `"zst"` one, decompressed."""
    if compression == "gz":
        return gzip_blocks(path)
    if compression == "zst":
        return zstd_blocks(path)
    return file_blocks(path, start, end)


def file_blocks(path: str, start: int = 0, end: int = -1) -> Iterator[bytes]:
    """Bytes `start:end` of a plain file (to the end when `end` < 0), one block at a time."""
    with reading(path), open(path, "rb") as fh:
        fh.seek(start)
        left = end - start if end >= 0 else -1
        while left != 0:
            block = fh.read(_BLOCK if left < 0 else min(_BLOCK, left))
            if not block:
                return
            left -= len(block) if left > 0 else 0
            yield block


def gzip_blocks(path: str) -> Iterator[bytes]:
    """Decompressed blocks of a `.gz`; a truncated or corrupted file is an InputError."""
    try:
        with gzip.open(path, "rb") as gz:
            while block := gz.read(_BLOCK):
                yield block
    except EOFError as exc:
        raise InputError(f"cannot decompress: the file is truncated ({exc})", path, hint=_TRUNCATED_HINT) from exc
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"cannot decompress: the file is corrupted ({exc})", path, hint=_TRUNCATED_HINT) from exc
    except OSError as exc:
        with reading(path):
            raise exc


def zstd_blocks(path: str) -> Iterator[bytes]:
    """Decompressed blocks of a `.zst` (every frame); a cut or corrupted file is an InputError."""
    import zstandard

    with reading(path):
        check_zstd_frames(path)
    try:
        with reading(path), open(path, "rb") as raw:
            reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
            while block := reader.read(_BLOCK):
                yield block
    except zstandard.ZstdError as exc:
        raise InputError(f"cannot decompress: the file is corrupted ({exc})", path, hint=_TRUNCATED_HINT) from exc


_ZSTD_MAGIC = 0xFD2FB528
_FCS_SIZES = (0, 2, 4, 8)
_DID_SIZES = (0, 1, 2, 4)


def check_zstd_frames(path: str) -> None:
    """Walk the frame and block headers of a `.zst` (a few bytes per 128 KiB block): every frame complete.

    Raises InputError "truncated" when the file ends inside a frame (in a header, a block or the
    checksum), "corrupted" when a header is not zstd. Skippable frames are stepped over.
    """
    size = os.path.getsize(path)
    with open(path, "rb", buffering=1 << 16) as fh:
        pos = 0
        while pos < size:
            magic = _read_exact(fh, 4, path, pos)
            (value,) = struct.unpack("<I", magic)
            if value & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame: 4-byte length, then data
                (length,) = struct.unpack("<I", _read_exact(fh, 4, path, pos))
                pos = _skip(fh, pos + 8 + length, size, path)
                continue
            if value != _ZSTD_MAGIC:
                raise InputError(
                    f"cannot decompress: not a zstd frame at byte {pos} (the file is corrupted)",
                    path,
                    hint=_TRUNCATED_HINT,
                )
            (fhd,) = _read_exact(fh, 1, path, pos)
            single = (fhd >> 5) & 1
            header = (
                (0 if single else 1) + _DID_SIZES[fhd & 3] + (1 if single and fhd >> 6 == 0 else _FCS_SIZES[fhd >> 6])
            )
            pos = _skip(fh, pos + 5 + header, size, path)
            while True:
                (b0, b1, b2) = _read_exact(fh, 3, path, pos)
                block = b0 | (b1 << 8) | (b2 << 16)
                kind = (block >> 1) & 3
                length = 1 if kind == 1 else block >> 3
                if kind == 3:
                    raise InputError(
                        f"cannot decompress: reserved zstd block type at byte {pos} (the file is corrupted)",
                        path,
                        hint=_TRUNCATED_HINT,
                    )
                pos = _skip(fh, pos + 3 + length, size, path)
                if block & 1:
                    break
            if (fhd >> 2) & 1:  # content checksum
                pos = _skip(fh, pos + 4, size, path)


def _read_exact(fh: BinaryIO, n: int, path: str, pos: int) -> bytes:
    data = fh.read(n)
    if len(data) < n:
        raise InputError(
            f"cannot decompress: the file is truncated (it ends inside a zstd frame near byte {pos})",
            path,
            hint=_TRUNCATED_HINT,
        )
    return data


def _skip(fh: BinaryIO, to: int, size: int, path: str) -> int:
    if to > size:
        raise InputError(
            f"cannot decompress: the file is truncated (a zstd frame needs {to} bytes, the file has {size})",
            path,
            hint=_TRUNCATED_HINT,
        )
    fh.seek(to)
    return to
