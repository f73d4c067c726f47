"""Parquet inputs: plan chunks by row groups, read rows with their 1-based row number.

A row is one record; its size is the bytes of its string and binary values (nested lists and
structs included, as chat `messages` are), checked against `--max-record-bytes` before the row
becomes Python objects. A corrupted data page or a cut file is a file-level InputError.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import InputError
from packtool.stages.tokenize.streams import RawRecord, too_long_reason

_HINT = "check that the file is a complete parquet file (re-write or re-download it)"
BATCH_ROWS = 4096


def plan_parquet(path: Path, chunk_bytes: int) -> list[tuple[int, int, int]]:
    """Group consecutive row groups until their compressed size reaches `chunk_bytes`."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as exc:  # pyarrow raises several types (ArrowInvalid, OSError) for a broken file
        raise InputError(f"cannot read parquet metadata ({exc})", str(path), hint=_HINT) from exc
    groups: list[tuple[int, int, int]] = []
    start, size = 0, 0
    for i in range(meta.num_row_groups):
        size += meta.row_group(i).total_byte_size
        if size >= chunk_bytes:
            groups.append((start, i + 1, size))
            start, size = i + 1, 0
    if start < meta.num_row_groups or not groups:
        groups.append((start, meta.num_row_groups, size))
    return groups


def parquet_rows(path: str, start: int, end: int, limit: int) -> Iterator[RawRecord]:
    """RawRecords of row groups `start:end`: the row as a dict, or an error for a row over `limit` bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        row = 1 + sum(pf.metadata.row_group(i).num_rows for i in range(start))
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=list(range(start, end))):
            yield from batch_records(path, batch, row, limit)
            row += batch.num_rows
    except (pa.ArrowException, OSError) as exc:  # a corrupted page, a cut file, an unreadable file
        raise InputError(f"cannot read parquet data ({exc})", path, hint=_HINT) from exc


def batch_records(path: str, batch: Any, row: int, limit: int) -> Iterator[RawRecord]:
    """The rows of one record batch (numbered from `row`) as dicts, or errors for rows over `limit` bytes.

    Shared by the parquet and Arrow readers, so both turn the same columns into the same values."""
    sizes = _row_bytes(batch)
    if not (sizes > limit).any():
        for value in batch.to_pylist():
            yield RawRecord(path, row, value)
            row += 1
        return
    for i in range(batch.num_rows):  # never turn an over-long row into Python objects
        if sizes[i] > limit:
            yield RawRecord(path, row, error=too_long_reason(int(sizes[i]), limit))
        else:
            yield RawRecord(path, row, batch.slice(i, 1).to_pylist()[0])
        row += 1


def _row_bytes(batch: Any) -> np.ndarray:
    """Bytes of string/binary data per row (nested lists and structs included)."""
    total = np.zeros(batch.num_rows, np.int64)
    for column in batch.columns:
        total += _value_bytes(column)
    return total


def _value_bytes(array: Any) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    t = array.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return np.asarray(pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False), np.int64)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        child = _value_bytes(array.flatten())
        parents = np.asarray(pc.list_parent_indices(array).to_numpy(zero_copy_only=False), np.int64)
        return np.bincount(parents, weights=child, minlength=len(array)).astype(np.int64)
    if pa.types.is_struct(t):
        out = np.zeros(len(array), np.int64)
        for field in array.flatten():
            out += _value_bytes(field)
        return out
    return np.full(len(array), t.bit_width // 8 if pa.types.is_primitive(t) and t.bit_width >= 8 else 0, np.int64)
