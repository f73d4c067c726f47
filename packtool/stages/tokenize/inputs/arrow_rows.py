"""Arrow record batches -> records: what the parquet and Arrow readers share, so both turn the same columns
into the same values.

A row is one record, a dict (structs are dicts, lists are lists). Its size is the bytes of its string
and binary values in every layout Arrow has (plain, large, view, dictionary, run-end, extension, nested
in lists, maps and structs), measured with numpy on the columns before the row becomes Python objects,
and held to `--max-record-bytes`. A JSON extension value (`arrow.json`, what `datasets`' json loader
writes for records whose keys or types differ) becomes the value it holds, as in the jsonl the dataset
came from. A schema naming a column (or a struct's field) twice is a file error: a row as a dict would
keep only one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from packtool.errors import InputError
from packtool.stages.tokenize.inputs.record import RawRecord, too_long_reason


def batch_records(path: str, batch: Any, row: int, limit: int) -> Iterator[RawRecord]:
    """The rows of one record batch (numbered from `row`) as dicts, or errors for rows over `limit` bytes.

    Shared by the parquet and Arrow readers, so both turn the same columns into the same values. A JSON
    extension value (`arrow.json`: what `datasets` writes for records whose keys or types differ) becomes
    the value it holds, as in the jsonl the dataset came from; one that does not parse is a bad record."""
    _check_names(path, batch.schema)
    sizes = _row_bytes(batch)
    decode = _decoder(batch.schema)
    over = sizes > limit
    values = batch.to_pylist() if not over.any() else None
    for i in range(batch.num_rows):
        if over[i]:  # never turn an over-long row into Python objects
            yield RawRecord(path, row, error=too_long_reason(int(sizes[i]), limit))
        else:
            value = values[i] if values is not None else batch.slice(i, 1).to_pylist()[0]
            if decode is None:
                yield RawRecord(path, row, value)
            else:
                try:
                    yield RawRecord(path, row, decode(value))
                except orjson.JSONDecodeError as exc:
                    yield RawRecord(path, row, error=f"malformed JSON in an arrow.json value ({exc})")
        row += 1


def _check_names(path: str, schema: Any) -> None:
    """InputError when a column, or a field of a struct at any depth, is named twice (pyarrow allows it)."""
    twice = _twice([f.name for f in schema], "column")
    stack = [(f.name, f.type) for f in schema]
    while twice is None and stack:
        name, kind = stack.pop()
        if pa.types.is_struct(kind):
            twice = _twice([kind.field(i).name for i in range(kind.num_fields)], f"field of struct {name!r}")
            stack.extend((f"{name}.{kind.field(i).name}", kind.field(i).type) for i in range(kind.num_fields))
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            stack.append((name, kind.value_type))
    if twice is not None:
        raise InputError(
            f"the table's schema names {twice} twice (a record holds one value per name)",
            path,
            hint="rename one of the two (e.g. table.rename_columns) and write the file again",
        )


def _twice(names: list[str], what: str) -> str | None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            return f"column {name!r}" if what == "column" else f"the field {name!r} of {what.removeprefix('field of ')}"
        seen.add(name)
    return None


Decode = Callable[[Any], Any]


def _decoder(schema: Any) -> Decode | None:
    """A function that parses the `arrow.json` values inside a row of `schema`, or None when it has none."""
    fields = [(f.name, d) for f in schema if (d := _type_decoder(f.type)) is not None]
    if not fields:
        return None

    def decode_row(row: dict[str, Any]) -> dict[str, Any]:
        for name, field_decoder in fields:
            row[name] = field_decoder(row[name])
        return row

    return decode_row


def _type_decoder(t: Any) -> Decode | None:
    if isinstance(t, pa.BaseExtensionType):
        if t.extension_name == "arrow.json":
            return _json_value
        return _type_decoder(t.storage_type)
    if pa.types.is_dictionary(t):
        return _type_decoder(t.value_type)
    if pa.types.is_run_end_encoded(t):
        return _type_decoder(t.value_type)
    if pa.types.is_map(t):
        key, item = _type_decoder(t.key_type), _type_decoder(t.item_type)
        if key is None and item is None:
            return None
        k, v = key or _same, item or _same
        return lambda value: None if value is None else [(k(a), v(b)) for a, b in value]
    if _is_list(t):
        inner = _type_decoder(t.value_type)
        return None if inner is None else (lambda value: None if value is None else [inner(x) for x in value])
    if pa.types.is_struct(t):
        fields = [(t.field(i).name, d) for i in range(t.num_fields) if (d := _type_decoder(t.field(i).type))]
        return None if not fields else _struct_decoder(fields)
    return None


def _struct_decoder(fields: list[tuple[str, Decode]]) -> Decode:
    def decode(value: Any) -> Any:
        if value is not None:
            for name, field_decoder in fields:
                value[name] = field_decoder(value[name])
        return value

    return decode


def _json_value(value: Any) -> Any:
    return None if value is None else orjson.loads(value)


def _same(value: Any) -> Any:
    return value


def _is_list(t: Any) -> bool:
    return bool(
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def _row_bytes(batch: Any) -> np.ndarray:
    """Bytes of string/binary data per row (nested lists and structs included)."""
    total = np.zeros(batch.num_rows, np.int64)
    for column in batch.columns:
        total += _value_bytes(column)
    return total


def _value_bytes(array: Any) -> np.ndarray:
    """Bytes per element of `array`: every layout that can hold a string counts its bytes, however encoded
    (dictionary, view, run-end, extension, nested), so no encoding passes `--max-record-bytes` unmeasured."""
    t = array.type
    n = len(array)
    if isinstance(t, pa.BaseExtensionType):
        return _value_bytes(array.storage)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return np.asarray(pc.binary_length(array).fill_null(0).to_numpy(zero_copy_only=False), np.int64)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return _view_bytes(array)
    if pa.types.is_fixed_size_binary(t):
        return np.full(n, t.byte_width, np.int64)
    if pa.types.is_dictionary(t):
        per_value = _value_bytes(array.dictionary)
        if not per_value.size:
            return np.zeros(n, np.int64)
        indices = np.asarray(array.indices.fill_null(0).to_numpy(zero_copy_only=False), np.int64)
        return np.where(_valid(array), per_value[indices], 0)
    if pa.types.is_run_end_encoded(t):
        return _value_bytes(pc.run_end_decode(array))
    if pa.types.is_map(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = np.asarray(array.offsets.to_numpy(zero_copy_only=False), np.int64)
        return _ranges(array.values, offsets[:-1], offsets[1:])
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        starts = np.asarray(array.offsets.to_numpy(zero_copy_only=False), np.int64)
        sizes = np.asarray(array.sizes.fill_null(0).to_numpy(zero_copy_only=False), np.int64)
        return _ranges(array.values, starts, starts + sizes)
    if pa.types.is_fixed_size_list(t):
        starts = (np.arange(n, dtype=np.int64) + array.offset) * t.list_size
        return _ranges(array.values, starts, starts + t.list_size)
    if pa.types.is_struct(t):
        out = np.zeros(n, np.int64)
        for field in array.flatten():
            out += _value_bytes(field)
        return out
    if pa.types.is_union(t):  # rare (never parquet nor `datasets`): every row counts the whole column
        return np.full(n, sum(b.size for b in array.buffers() if b is not None), np.int64)
    return np.full(n, t.bit_width // 8 if pa.types.is_primitive(t) and t.bit_width >= 8 else 0, np.int64)


def _ranges(values: Any, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Bytes of `values[starts[i]:ends[i]]` per i, measuring only the child values the ranges cover."""
    if starts.size == 0:
        return np.zeros(0, np.int64)
    lo, hi = int(starts.min()), int(ends.max())
    child = _value_bytes(values.slice(lo, max(hi - lo, 0)))
    cumulative = np.concatenate(([0], np.cumsum(child, dtype=np.int64)))
    return cumulative[ends - lo] - cumulative[starts - lo]


def _view_bytes(array: Any) -> np.ndarray:
    """Lengths of a string_view / binary_view array, read from its 16-byte views (the length is their first int32)."""
    views = np.frombuffer(array.buffers()[1], np.int32).reshape(-1, 4)[array.offset : array.offset + len(array), 0]
    return np.where(_valid(array), views, 0).astype(np.int64)


def _valid(array: Any) -> np.ndarray:
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), bool)
