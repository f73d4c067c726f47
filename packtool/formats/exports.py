"""Every byte `packtool export` writes: trainer file names, column types, and the staged, atomic writer.

Names follow each trainer's own convention for split S and pack size N:

| target            | files                                                    |
|-------------------|----------------------------------------------------------|
| megatron-bridge   | `{S}_{N}.idx.parquet` + `{N}_metadata.jsonl` (a JSON array) |
| nemo              | `{S}_{N}.npy` (pickled object array, the legacy format) + `{N}_metadata.jsonl` |
| trl               | `{S}_{N}.parquet`                                        |
| olmo-core         | `{S}_{N}.npy` (raw tokens) + `{S}_{N}.label_mask.npy` (raw bool) |

`StagedExport` writes every file under a hidden temp name in the output directory and renames
them only when all were written (the metadata last), so a reader never sees half an export and a
failed one leaves nothing behind. Parquet files are written one row group at a time and raw files
appended block by block, so memory stays bounded by one block of packs (the legacy NeMo file is
the exception: it is one pickle, built whole, as its readers also load it whole).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from packtool.errors import FormatError, OutputExistsError
from packtool.formats import jsontext
from packtool.formats.atomic import fsync_dir, pid_alive, temp_sibling
from packtool.formats.faults import fault_point

#: Megatron-Bridge's metadata keys (`create_packing_strategy`), copied from the pack store's line
MEGATRON_METADATA_KEYS = (
    "dataset_max_seqlen",
    "max_samples_per_bin",
    "packing_factor",
    "packing_efficiency",
    "pack_size",
    "min_packed_seqlen",
)
#: row groups of Megatron-Bridge's reader are decoded whole on every cache miss: keep them ~1M tokens
ROW_GROUP_TOKENS = 1 << 20
MAX_ROW_GROUP_ROWS = 500  # Megatron-Bridge's own `write_packed_parquet` default


def megatron_parquet_name(split: str, size: int) -> str:
    return f"{split}_{size}.idx.parquet"


def megatron_metadata_name(size: int) -> str:
    return f"{size}_metadata.jsonl"


def nemo_name(split: str, size: int) -> str:
    return f"{split}_{size}.npy"


def trl_name(split: str, size: int) -> str:
    return f"{split}_{size}.parquet"


def olmo_tokens_name(split: str, size: int) -> str:
    return f"{split}_{size}.npy"


def olmo_label_mask_name(split: str, size: int) -> str:
    return f"{split}_{size}.label_mask.npy"


def _schemas() -> dict[str, Any]:
    import pyarrow as pa

    return {
        "megatron-bridge": pa.schema(
            [
                ("input_ids", pa.list_(pa.int32())),
                ("loss_mask", pa.list_(pa.int8())),
                ("seq_start_id", pa.list_(pa.int32())),
            ]
        ),
        "trl": pa.schema(
            [
                ("input_ids", pa.list_(pa.int32())),
                ("labels", pa.list_(pa.int32())),
                ("seq_lengths", pa.list_(pa.int32())),
            ]
        ),
    }


def row_group_rows(size: int) -> int:
    """Rows per Parquet row group for packs of `size` tokens (1..500, about 1M tokens)."""
    return max(1, min(MAX_ROW_GROUP_ROWS, ROW_GROUP_TOKENS // max(1, size)))


class ParquetRows:
    """Appends blocks of list columns, each given as flat `values` + per-row `offsets`, to one Parquet file."""

    def __init__(self, path: Path, schema_name: str, rows_per_group: int) -> None:
        import pyarrow.parquet as pq

        self.schema = _schemas()[schema_name]
        self.rows_per_group = rows_per_group
        # no dictionary pages: token ids are high-cardinality; 2x faster to write and smaller than with them
        self._writer = pq.ParquetWriter(str(path), self.schema, use_dictionary=False)

    def write(self, columns: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """`columns[name] = (offsets int32 [rows + 1], values)`, every column with the same row count."""
        import pyarrow as pa

        arrays = []
        for field in self.schema:
            offsets, values = columns[field.name]
            value_type = field.type.value_type
            flat = pa.array(np.ascontiguousarray(values, dtype=value_type.to_pandas_dtype()), type=value_type)
            arrays.append(pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), flat))
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema), row_group_size=self.rows_per_group)

    def close(self) -> None:
        self._writer.close()


class PickledIntList:
    """A list of non-negative ints already in pickle's opcodes, written verbatim (`EMPTY_LIST MARK items APPENDS`).

    Each int is `BININT1`/`BININT2`/`BININT` (1, 2 or 4 bytes after the opcode, the narrowest that
    holds the array's largest value), encoded for the whole array at once with numpy: unpickling
    gives a plain `list` of Python `int`, exactly what pickling the list would have given.
    """

    __slots__ = ("data",)

    def __init__(self, values: np.ndarray) -> None:
        values = np.asarray(values)
        if values.size == 0:
            self.data = b"]"
            return
        top = int(values.max())
        if int(values.min()) < 0 or top >= 2**31:
            raise ValueError("PickledIntList holds ints in 0..2**31-1")
        op, width = (b"K", "<u1") if top < 256 else (b"M", "<u2") if top < 65536 else (b"J", "<i4")
        items = np.empty(values.size, dtype=[("op", "u1"), ("v", width)])  # packed: 1 + width bytes per int
        items["op"] = op[0]
        items["v"] = values
        self.data = b"](" + items.tobytes() + b"e"


class _RowPickler(pickle._Pickler):  # the pure-Python pickler: it lets one type write raw opcodes
    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def _save_pickled_list(self, obj: PickledIntList) -> None:
        self.write(obj.data)  # type: ignore[attr-defined]

    dispatch[PickledIntList] = _save_pickled_list  # type: ignore[assignment]


def write_object_npy(fh: BinaryIO, rows: list[dict[str, PickledIntList]]) -> None:
    """The legacy NeMo / Megatron-Bridge packed file: a `.npy` of a 1-D object array of dicts of lists.

    Byte for byte what `np.save(np.array(rows_of_python_lists))` loads as (numpy's `.npy` header,
    then a pickle of the object array); the int lists are pre-encoded (`PickledIntList`) instead of
    being built as Python objects, ~10x faster. Readers unpickle it (Megatron-Bridge with a
    restricted unpickler allowing builtins and the ndarray container only): every value loads as
    a plain list of Python ints.
    """
    arr = np.empty(len(rows), dtype=object)
    arr[:] = rows
    np.lib.format.write_array_header_1_0(fh, {"descr": "|O", "fortran_order": False, "shape": (len(rows),)})
    _RowPickler(fh, protocol=3).dump(arr)


def merged_megatron_metadata(path: Path, entry: dict[str, Any]) -> bytes:
    """Megatron-Bridge's `{N}_metadata.jsonl`: a JSON ARRAY of one object per split (json.load reads it).

    An existing file's entry for the same `split` is replaced, others are kept (train and
    validation exported into one directory share the file, as Megatron-Bridge writes it).
    """
    entries: list[dict[str, Any]] = []
    if path.exists():
        try:
            loaded = jsontext.loads(path.read_text("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FormatError(
                f"{path.name} is not a JSON array ({exc}), {path}, remove it or export to another --output"
            ) from exc
        if not isinstance(loaded, list) or not all(isinstance(e, dict) for e in loaded):
            raise FormatError(
                f"{path.name} is not a JSON array of objects, {path}, remove it or export to another --output"
            )
        entries = [e for e in loaded if e.get("split") != entry["split"]]
    entries.append(entry)
    return json.dumps(entries).encode()


class StagedExport:
    """Output files of one export, written under hidden temp names and renamed together on `commit`.

    `names` are the data files: if one exists already the export is refused unless `overwrite`.
    `shared` files (the Megatron-Bridge metadata array) may exist: they are merged, not refused.
    Use as a context manager: an exception removes every temp (and the directory if this export
    created it), so nothing is ever left under a final name or half-written.
    """

    def __init__(self, directory: Path, names: list[str], shared: list[str], overwrite: bool) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise OutputExistsError(f"output {self.directory} exists and is not a directory, choose another --output")
        if not overwrite:
            for name in names:
                if (self.directory / name).exists():
                    raise OutputExistsError(
                        f"{name} already exists, {self.directory}, pass --overwrite to replace it or choose another --output"
                    )
        self.names = list(names) + list(shared)
        self._created = not self.directory.exists()
        self.temps = {name: temp_sibling(self.directory / name) for name in self.names}

    def __enter__(self) -> StagedExport:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._recover()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._commit()
        else:
            self._abort()

    def _recover(self) -> None:
        """Undo what a killed export of these names left (call under the output's lock): temps of dead
        pids go, and the files a commit had moved aside (`.NAME.old-PID`) are put back, so the output
        is the previous export again, whole."""
        for name in self.names:
            for tag in ("tmp", "old"):
                for path in self.directory.glob(f".{name}.{tag}-*"):
                    pid = path.name.rsplit("-", 1)[-1]
                    if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
                        continue
                    if tag == "old":
                        os.replace(path, self.directory / name)
                    else:
                        path.unlink(missing_ok=True)

    def path(self, name: str) -> Path:
        """The temp path to write `name` to."""
        return self.temps[name]

    def final(self, name: str) -> Path:
        return self.directory / name

    def _commit(self) -> None:
        """Fsync the temps, move every existing final aside, rename every temp in (data first, shared
        metadata last), then drop the old copies. Any exception before the end puts the old files back;
        a SIGKILL in between leaves some names missing (a reader fails, never mixes two exports) until
        the next export into the directory puts the old ones back (`_recover`)."""
        missing = [n for n, t in self.temps.items() if not t.exists()]
        if missing:
            self._abort()
            raise FormatError(f"export did not write {', '.join(missing)}, {self.directory}, this is a bug")
        olds: dict[str, Path] = {}
        placed: list[str] = []
        try:
            for tmp in self.temps.values():
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
            for name in self.names:  # every old file aside first: a kill now leaves files missing, never mixed
                final = self.directory / name
                if final.exists():
                    fault_point(f"export.aside.before:{name}")
                    olds[name] = temp_sibling(final, "old")
                    os.replace(final, olds[name])
            for name in self.names:
                fault_point(f"export.rename.before:{name}")
                os.replace(self.temps[name], self.directory / name)
                placed.append(name)
            fsync_dir(self.directory)
        except BaseException:
            for name in placed:
                if name not in olds:
                    (self.directory / name).unlink(missing_ok=True)
            for name, old in olds.items():
                os.replace(old, self.directory / name)
            self._abort()
            raise
        try:
            fault_point("export.committed")
        finally:
            for old in olds.values():
                old.unlink(missing_ok=True)

    def _abort(self) -> None:
        for tmp in self.temps.values():
            tmp.unlink(missing_ok=True)
        if self._created and self.directory.is_dir() and not any(self.directory.iterdir()):
            self.directory.rmdir()
