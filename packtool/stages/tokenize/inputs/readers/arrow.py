"""Arrow: IPC files and streams (`.arrow`, and `.feather`: Feather V2 is the IPC file format), as `datasets`
writes them (a `save_to_disk` directory's files are found by `locators/saved.py`).

An `.arrow` file is memory-mapped and read one record batch at a time, in slices of
`BATCH_ROWS` rows, so memory stays bounded whatever the file's size or its batches' size. Both
Arrow IPC layouts are read: the file format (`ARROW1` magic, random access to batches) and the
stream format that `datasets` writes. Rows become records exactly as parquet rows do (the same
`batch_records`: structs are dicts, lists are lists, row numbers 1-based), so a dataset gives
the same bytes from parquet, Arrow or jsonl.

Chunks are row ranges cut at about `chunk_bytes` of batch data (a large batch is cut inside),
found by walking the batches' headers at planning, which also finds a cut or corrupted file
before any work.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from packtool.errors import InputError
from packtool.formats.oserrors import reading
from packtool.stages.tokenize.inputs.readers.base import Numbering, Plan, ReaderDefaults, Span, whole_file
from packtool.stages.tokenize.inputs.record import RawRecord

if TYPE_CHECKING:
    from packtool.stages.tokenize.inputs.chunk import Chunk

BATCH_ROWS = 4096
_HINT = "check that the file is a complete Arrow IPC file or stream (re-write or re-download it)"
_FILE_MAGIC = b"ARROW1"
_FEATHER_V1_MAGIC = b"FEA1"
_FEATHER_V1_HINT = (
    "re-write it as Feather V2, which is Arrow IPC: pyarrow.feather.write_feather(pyarrow.feather.read_table(OLD), NEW)"
)


class _NotIPC(Exception):
    """The file is something pyarrow can read, but not as Arrow IPC (a Feather V1 file)."""


def _batches(source: Any) -> Iterator[Any]:
    """Record batches of a memory-mapped IPC file or stream, read lazily (zero-copy)."""
    import pyarrow as pa

    magic = source.read(len(_FILE_MAGIC))
    source.seek(0)
    if magic.startswith(_FEATHER_V1_MAGIC):
        raise _NotIPC("a Feather V1 file (Arrow's deprecated pre-IPC layout), not an Arrow IPC file or stream")
    if magic == _FILE_MAGIC:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
    else:
        yield from pa.ipc.open_stream(source)


class ArrowReader(ReaderDefaults):
    kind: str = "arrow"
    suffixes: tuple[str, ...] = (".arrow", ".feather")  # Feather v2 is the Arrow IPC file format
    numbering: Numbering = Numbering.ROW
    family: str = "arrow"
    family_rank: int = 1

    def plan(self, path: str, chunk_bytes: int) -> Plan:
        return Plan(whole_file(path).n_bytes, [Span(s, e, 1, b) for s, e, b in _plan_rows(path, chunk_bytes)])

    def read(self, chunk: Chunk, limit: int, separator: str | None) -> Iterator[RawRecord]:
        return _rows(chunk.paths[0], chunk.start, chunk.end, limit)


READERS = (ArrowReader(),)


def _plan_rows(path: str, chunk_bytes: int) -> list[tuple[int, int, int]]:
    """Row ranges (start, end, bytes of batch data) of about `chunk_bytes` each; InputError for a broken file."""
    import math

    import pyarrow as pa

    chunks: list[tuple[int, int, int]] = []
    start, row, size = 0, 0, 0.0
    with reading(path):
        mapped = pa.memory_map(path)
    try:
        with mapped as source:
            for batch in _batches(source):
                n = batch.num_rows
                per_row = int(batch.nbytes) / n if n else 0.0
                pos = 0
                while pos < n:  # a batch larger than a chunk is cut inside
                    room = chunk_bytes - size
                    take = n - pos if per_row == 0 else min(n - pos, max(1, math.ceil(room / per_row)))
                    pos, row, size = pos + take, row + take, size + take * per_row
                    if size >= chunk_bytes:
                        chunks.append((start, row, int(size)))
                        start, size = row, 0.0
    except _NotIPC as exc:
        raise InputError(str(exc), path, hint=_FEATHER_V1_HINT) from exc
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"cannot read Arrow data ({exc})", path, hint=_HINT) from exc
    if start < row or not chunks:
        chunks.append((start, row, int(size)))
    return chunks


def _rows(path: str, start: int, end: int, limit: int) -> Iterator[RawRecord]:
    """RawRecords of rows `start:end` (0-based; numbered from 1 like parquet rows)."""
    import pyarrow as pa

    from packtool.stages.tokenize.inputs.arrow_rows import batch_records

    with reading(path):
        mapped = pa.memory_map(path)
    try:
        with mapped as source:
            row = 0
            for batch in _batches(source):
                n = batch.num_rows
                lo, hi = max(start, row), min(end, row + n)
                for s in range(lo, hi, BATCH_ROWS):
                    piece = batch.slice(s - row, min(BATCH_ROWS, hi - s))
                    yield from batch_records(path, piece, s + 1, limit)
                row += n
                if row >= end:
                    return
    except _NotIPC as exc:
        raise InputError(str(exc), path, hint=_FEATHER_V1_HINT) from exc
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"cannot read Arrow data ({exc})", path, hint=_HINT) from exc
