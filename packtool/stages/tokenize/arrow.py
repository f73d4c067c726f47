"""Arrow inputs: IPC files and streams (`.arrow`, and `.feather`: Feather V2 is the IPC file format), and
`datasets` `save_to_disk` directories.

An `.arrow` file is memory-mapped and read one record batch at a time, in slices of
`BATCH_ROWS` rows, so memory stays bounded whatever the file's size or its batches' size. Both
Arrow IPC layouts are read: the file format (`ARROW1` magic, random access to batches) and the
stream format that `datasets` writes. Rows become records exactly as parquet rows do (the same
`batch_records`: structs are dicts, lists are lists, row numbers 1-based), so a dataset gives
the same bytes from parquet, Arrow or jsonl.

Chunks are row ranges cut at about `chunk_bytes` of batch data (a large batch is cut inside),
found by walking the batches' headers at planning, which also finds a cut or corrupted file
before any work. A `save_to_disk` directory (`state.json` + `dataset_info.json` +
`data-XXXXX-of-YYYYY.arrow`) is one dataset: its files in `state.json`'s order. A
`DatasetDict` directory (`dataset_dict.json`) holds several splits: the user names one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packtool.errors import InputError
from packtool.formats.oserrors import reading
from packtool.formats.paths import contained
from packtool.stages.tokenize.parquet import batch_records
from packtool.stages.tokenize.streams import RawRecord

BATCH_ROWS = 4096
_HINT = "check that the file is a complete Arrow IPC file or stream (re-write or re-download it)"
_FILE_MAGIC = b"ARROW1"
_FEATHER_V1_MAGIC = b"FEA1"
_FEATHER_V1_HINT = (
    "re-write it as Feather V2, which is Arrow IPC: pyarrow.feather.write_feather(pyarrow.feather.read_table(OLD), NEW)"
)

STATE = "state.json"
INFO = "dataset_info.json"
DICT = "dataset_dict.json"


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


def plan_arrow(path: str, chunk_bytes: int) -> list[tuple[int, int, int]]:
    """Row ranges (start, end, bytes of batch data) of about `chunk_bytes` each; InputError for a broken file."""
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


def arrow_rows(path: str, start: int, end: int, limit: int) -> Iterator[RawRecord]:
    """RawRecords of rows `start:end` (0-based; numbered from 1 like parquet rows)."""
    import pyarrow as pa

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


def is_saved_dataset(path: Path) -> bool:
    """A `datasets` `save_to_disk` directory (one split) or a `DatasetDict` one (several)."""
    return ((path / STATE).is_file() and (path / INFO).is_file()) or (path / DICT).is_file()


def saved_dataset_files(path: Path, given: str, within: Path | None = None) -> list[Path]:
    """The Arrow files of a `save_to_disk` directory, in `state.json`'s order.

    Every name `state.json` lists must stay inside the directory, and its file (a link, in the hub cache)
    inside `within` (default: the directory): `formats.paths`."""
    if (path / DICT).is_file():
        splits = _dataset_dict_splits(path, given)
        raise InputError(
            f"a DatasetDict directory (splits: {', '.join(splits) or 'none'}) is several datasets",
            given,
            hint=f"name one split's directory, e.g. {given.rstrip('/')}/{splits[0] if splits else 'train'}",
        )
    names = _data_file_names(path / STATE, given)
    if not names:
        raise InputError(
            f"the save_to_disk directory lists no data files ({STATE}'s _data_files is empty)",
            given,
            hint="re-save the dataset with Dataset.save_to_disk",
        )
    files = [
        contained(path, name, f"{STATE}'s _data_files", hint=_SAVED_HINT, links_within=within or path) for name in names
    ]
    for file in files:
        if file.suffix != ".arrow" or not file.is_file():
            raise InputError(
                f"{STATE} lists {file.name} but the directory has no such Arrow file",
                given,
                hint="the dataset was copied incompletely; re-save it with Dataset.save_to_disk",
            )
    return files


_SAVED_HINT = (
    "packtool reads only the files inside the directory it is given; re-save the dataset with Dataset.save_to_disk"
)


def _data_file_names(state: Path, given: str) -> list[str]:
    """The `filename`s of `state.json`'s `_data_files`, each a string; InputError for anything else."""
    with reading(str(state)):
        text = state.read_bytes()
    try:
        entries = json.loads(text)["_data_files"]
        names = [entry["filename"] for entry in entries]
        if not isinstance(entries, list) or not all(isinstance(n, str) for n in names):
            raise TypeError("_data_files must be a list of {'filename': NAME}")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: a hostile nesting
        raise InputError(
            f"cannot read the file list of a save_to_disk directory ({STATE}: {type(exc).__name__}: {str(exc)[:200]})",
            given,
            hint="re-save the dataset with Dataset.save_to_disk",
        ) from exc
    return names


def _dataset_dict_splits(path: Path, given: str) -> list[str]:
    """The splits `dataset_dict.json` lists (each a directory name inside); else the subdirectories holding a split."""
    try:
        splits = json.loads((path / DICT).read_bytes()).get("splits")
    except (ValueError, AttributeError, OSError, RecursionError):
        splits = None
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        return sorted(p.name for p in path.iterdir() if p.is_dir() and (p / STATE).is_file())
    for split in splits:
        contained(path, split, f"{DICT}'s splits", hint=_SAVED_HINT, one_part=True)
    return splits
