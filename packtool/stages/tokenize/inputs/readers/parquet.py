"""Parquet: chunks are runs of row groups, records are rows numbered from 1 (`inputs/arrow_rows.py`).

A corrupted data page or a cut file is a file-level InputError.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from packtool.errors import InputError
from packtool.stages.tokenize.inputs.readers.base import Numbering, Plan, ReaderDefaults, Span
from packtool.stages.tokenize.inputs.record import RawRecord

if TYPE_CHECKING:
    from packtool.stages.tokenize.inputs.chunk import Chunk

_HINT = "check that the file is a complete parquet file (re-write or re-download it)"
BATCH_ROWS = 4096


class ParquetReader(ReaderDefaults):
    kind: str = "parquet"
    suffixes: tuple[str, ...] = (".parquet",)
    numbering: Numbering = Numbering.ROW
    family: str = "parquet"
    family_rank: int = 0

    def plan(self, path: str, chunk_bytes: int) -> Plan:
        """Group consecutive row groups until their compressed size reaches `chunk_bytes`."""
        import pyarrow.parquet as pq

        from packtool.stages.tokenize.inputs.readers.base import whole_file

        size = whole_file(path).n_bytes  # an unreadable file fails as every input does
        try:
            meta = pq.ParquetFile(path).metadata
        except Exception as exc:  # pyarrow raises several types (ArrowInvalid, OSError) for a broken file
            raise InputError(f"cannot read parquet metadata ({exc})", path, hint=_HINT) from exc
        groups: list[Span] = []
        start, group_bytes = 0, 0
        for i in range(meta.num_row_groups):
            group_bytes += meta.row_group(i).total_byte_size
            if group_bytes >= chunk_bytes:
                groups.append(Span(start, i + 1, 1, group_bytes))
                start, group_bytes = i + 1, 0
        if start < meta.num_row_groups or not groups:
            groups.append(Span(start, meta.num_row_groups, 1, group_bytes))
        return Plan(size, groups)

    def read(self, chunk: Chunk, limit: int, separator: str | None) -> Iterator[RawRecord]:
        """The rows of row groups `start:end`: each a dict, or an error for a row over `limit` bytes."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from packtool.stages.tokenize.inputs.arrow_rows import batch_records

        path = chunk.paths[0]
        try:
            pf = pq.ParquetFile(path)
            row = 1 + sum(pf.metadata.row_group(i).num_rows for i in range(chunk.start))
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=list(range(chunk.start, chunk.end))):
                yield from batch_records(path, batch, row, limit)
                row += batch.num_rows
        except (pa.ArrowException, OSError) as exc:  # a corrupted page, a cut file, an unreadable file
            raise InputError(f"cannot read parquet data ({exc})", path, hint=_HINT) from exc


READERS = (ParquetReader(),)
