"""Raw inputs: expand paths, cut them into deterministic chunks, read records with file:line.

A chunk is the unit of work a tokenizer worker (a local process, or a Ray task) handles on its
own: a byte range of a `.jsonl` file aligned to line starts (with the 1-based number of its
first line), a whole compressed `.jsonl.gz` / `.jsonl.zst` file (streams cannot seek), a range
of parquet row groups, a byte range of a `.json` array aligned to element starts
(`jsonarray.py`), a row range of an Arrow file (`arrow.py`), or a run of consecutive `.txt`
files. A `save_to_disk` directory is one input (its Arrow files in `state.json`'s order) and
`hf://datasets/ORG/NAME[/PATH]` is read from the local hub cache (`hub.py`). Chunking depends only on the
files and `chunk_bytes`, never on the number of workers, so every worker count writes the
same bytes and an interrupted run can resume chunk by chunk.

Blank (whitespace-only) jsonl lines are not records: they are skipped silently, as most
jsonl writers and readers do; all other lines are records, good or bad.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtool.errors import InputError
from packtool.formats.oserrors import reading
from packtool.formats.paths import check_within
from packtool.stages.tokenize.arrow import arrow_rows, is_saved_dataset, plan_arrow, saved_dataset_files
from packtool.stages.tokenize.hub import hub_dataset_target, is_hub_input, pick_data_files
from packtool.stages.tokenize.jsonarray import check_json_lines, json_array_records, plan_json_array, starts_as_array
from packtool.stages.tokenize.parquet import parquet_rows, plan_parquet
from packtool.stages.tokenize.streams import (
    BOM,
    DEFAULT_MAX_RECORD_BYTES,
    PlainText,
    RawRecord,
    TooLong,
    file_blocks,
    gzip_blocks,
    split_records,
    too_long_reason,
    zstd_blocks,
)

try:  # orjson parses ~3x faster; plain json is the fallback
    import orjson

    _loads = orjson.loads
    _JSONError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover - orjson is a dependency
    import json

    _loads = json.loads  # type: ignore[assignment]
    _JSONError = ValueError

SUFFIXES = {
    ".jsonl": "jsonl",
    ".jsonl.gz": "jsonl.gz",
    ".jsonl.zst": "jsonl.zst",
    ".json": "json",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",  # Feather v2 is the Arrow IPC file format (`pyarrow.feather.write_feather`)
    ".txt": "txt",
}
#: chunk kinds whose records are addressed by a 0-based index (`record N`), not a line or row number
INDEXED_KINDS = frozenset({"json"})
#: `.json` files a directory walk leaves out: model, tokenizer, dataset and store metadata, not records
NOT_DATA_JSON = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "config.json",
        "generation_config.json",
        "manifest.json",
        "dataset_info.json",
        "dataset_infos.json",
        "state.json",
        "dataset_dict.json",
    }
)
_KINDS_TEXT = ".jsonl(.gz|.zst), .json, .parquet, .arrow, .feather, .txt, save_to_disk directories"
_BLOCK = 1 << 22


def source_kind(path: str | os.PathLike[str]) -> str | None:
    """The reader for a file name (`jsonl`, `jsonl.gz`, `jsonl.zst`, `json`, `parquet`, `arrow`, `txt`), or None."""
    name = os.fspath(path).lower()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return SUFFIXES[suffix]
    return None


def expand_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Files, directories (recursive), globs and `hf://datasets/...` -> sorted, de-duplicated input files.

    The order is the sorted path order, except that a `save_to_disk` directory's files keep
    `state.json`'s order (they sort as the directory's own path)."""
    if not inputs:
        raise InputError("no input given", hint=f"pass files, directories or globs of {_KINDS_TEXT}")
    found: dict[Path, tuple[str, int]] = {}
    for item in inputs:
        text = os.fspath(item)
        if not text.strip():  # Path("") is ".": an unset shell variable must not read the working directory
            raise InputError(
                "an input argument is empty (an unset shell variable?)",
                repr(text),
                hint=f"pass files, directories or globs of {_KINDS_TEXT}",
            )
        with reading(text):  # a directory on the way that cannot be listed, etc.
            found.update(_expand_hub(text) if is_hub_input(text) else _expand_one(text))
    return sorted(found, key=lambda p: found[p])


def _walk_files(root: Path) -> list[Path]:
    """Files under `root`, hidden directories pruned, symlinked directories not followed (as rglob);
    a directory that cannot be listed raises instead of being skipped silently. A `save_to_disk`
    directory met on the way is listed itself, not walked: `_expand_dir` expands it."""

    def fail(exc: OSError) -> None:
        raise exc

    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if is_saved_dataset(Path(dirpath)):
            dirnames[:] = []
            out.append(Path(dirpath))
            continue
        out.extend(Path(dirpath) / name for name in filenames)
    return out


def _norm(path: Path) -> Path:
    """The resolved path, or, when a link's target is named otherwise (a hub snapshot's files link
    to blobs named by hash), the absolute path of the link: the reader is picked by the name."""
    resolved = path.resolve()
    return resolved if source_kind(resolved) == source_kind(path) else path.parent.resolve() / path.name


def _plain(path: Path) -> dict[Path, tuple[str, int]]:
    path = _norm(path)
    return {path: (str(path), -1)}


_LINK_HINT = "name the file itself to read it (a link you name is followed), or fix or remove the link"


def _found(path: Path, root: Path, how: str) -> Path:
    """A file a directory walk or a glob found: a link among them must lead to a file inside `root`
    (`formats.paths`): one leading out, nowhere or in a loop is an error, never skipped or followed."""
    check_within(path, root, f"a {'link' if path.is_symlink() else 'path'} that {how} found", hint=_LINK_HINT)
    if path.is_symlink() and not path.exists():
        raise InputError(f"a link that {how} found leads to no file", str(path), hint="fix or remove the link")
    return path


def _dataset(path: Path, given: str, within: Path | None = None) -> dict[Path, tuple[str, int]]:
    """A `save_to_disk` directory's files, keyed to sort in `state.json`'s order at the directory's place."""
    key = str(path.resolve())
    return {_norm(p): (key, i) for i, p in enumerate(saved_dataset_files(path, given, within or path))}


def _expand_dir(path: Path, within: Path | None = None) -> dict[Path, tuple[str, int]]:
    """A directory's supported files; links among them must lead inside it (inside `within`, when given)."""
    root = within or path
    out: dict[Path, tuple[str, int]] = {}
    for p in _walk_files(path):
        if p.is_dir():  # a save_to_disk directory (the walk follows no linked directory)
            out.update(_dataset(p, str(p), root))
        elif source_kind(p) and not _hidden(p, path) and p.name not in NOT_DATA_JSON:
            if p.is_symlink():  # the walk follows no linked directory: only the file itself can be a link
                _found(p, root, "the directory walk")
            if p.is_file():  # not a pipe or a socket
                out.update(_plain(p))
    return out


def _expand_glob(pattern: str, within: Path | None = None) -> dict[Path, tuple[str, int]]:
    """A glob's supported files; links among them must lead inside the glob's fixed directory (or `within`)."""
    root = within or _glob_base(pattern)
    out: dict[Path, tuple[str, int]] = {}
    for p in map(Path, glob.glob(pattern, recursive=True)):  # `**` enters linked directories: check every match
        if p.is_dir() and is_saved_dataset(p):
            out.update(_dataset(_found(p, root, "the glob"), str(p), root))
        elif source_kind(p) and (p.is_file() or p.is_symlink()) and _found(p, root, "the glob").is_file():
            out.update(_plain(p))
    return out


def _glob_base(pattern: str) -> Path:
    """The directory a glob lies in: its parts before the first one with a wildcard."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    return Path(*parts[:fixed]) if fixed else Path(".")


def _expand_one(text: str) -> dict[Path, tuple[str, int]]:
    """One input argument -> its supported files, with their sort keys."""
    path = Path(text)
    if path.is_dir():
        if is_saved_dataset(path):
            return _dataset(path, text)
        matches = _expand_dir(path)
        if not matches:
            raise InputError(f"directory holds no {_KINDS_TEXT}", text, hint="check the path")
        return matches
    if path.is_file():
        if source_kind(path) is None:
            raise InputError(
                "unsupported input type (expected .jsonl, .jsonl.gz, .jsonl.zst, .json, .parquet, .arrow, .feather or .txt)",
                text,
                hint="rename or convert the file",
            )
        return _plain(path)
    if path.exists():
        raise InputError("is not a regular file (a device, a pipe or a socket)", text, hint="pass a file")
    matches = _expand_glob(text)
    if not matches:
        raise InputError(
            "input does not exist or the glob matches no supported file", text, hint="check the path or quote the glob"
        )
    return matches


def _expand_hub(text: str) -> dict[Path, tuple[str, int]]:
    """`hf://datasets/ORG/NAME[/PATH]` -> the data files of its cached snapshot (`hub.py` says which)."""
    snapshot, name, target, within = hub_dataset_target(text)
    if target == snapshot:
        walked = _expand_dir(snapshot, within)
        picked = set(pick_data_files([(p, source_kind(p) or "") for p in walked], snapshot, name, text))
        out = {p: key for p, key in walked.items() if p in picked}
    elif target.is_dir():
        out = _dataset(target, text, within) if is_saved_dataset(target) else _expand_dir(target, within)
    elif target.is_file():
        out = _plain(target) if source_kind(target) else {}
    else:
        out = _expand_glob(str(target), within)
    if not out:
        inner = target.relative_to(snapshot).as_posix() if target != snapshot else ""
        where = f" at {inner!r}" if inner else ""
        raise InputError(
            f"dataset {name} in the hub cache ({snapshot}) holds no {_KINDS_TEXT}{where}",
            text,
            hint="name a data file, directory or glob inside it: hf://datasets/ORG/NAME/PATH",
        )
    return out


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


@dataclass(frozen=True)
class Chunk:
    """One deterministic unit of work. `start`/`end`: bytes (jsonl, json), row groups (parquet) or rows
    (arrow); `first_line`: the first line's number (jsonl) or the first element's 0-based index (json)."""

    index: int
    kind: str
    paths: tuple[str, ...]
    start: int = 0
    end: int = -1
    first_line: int = 1
    n_bytes: int = 0


@dataclass(frozen=True)
class SourceFile:
    """A planned input file. Its sha256 (manifest, resume) is computed beside the work, not before it."""

    path: str
    n_bytes: int


def input_bytes(paths: Sequence[Path]) -> int:
    """The inputs' total size on disk (an input that cannot be read counts 0: `plan_chunks` reports it)."""
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += os.stat(path).st_size
    return total


def plan_chunks(paths: Sequence[Path], chunk_bytes: int) -> tuple[list[SourceFile], list[Chunk]]:
    """Cut the inputs into chunks of about `chunk_bytes`: `.jsonl` and `.json` files are scanned (newlines
    or array elements counted), parquet and Arrow files' metadata and batch headers are read."""
    sources: list[SourceFile] = []
    chunks: list[Chunk] = []
    txt_run: list[SourceFile] = []

    def flush_txt() -> None:
        if txt_run:
            chunks.append(
                Chunk(len(chunks), "txt", tuple(s.path for s in txt_run), n_bytes=sum(s.n_bytes for s in txt_run))
            )
            txt_run.clear()

    for path in paths:
        kind = source_kind(path) or ""
        if kind == "json" and not starts_as_array(str(path)):
            check_json_lines(str(path))  # one pretty-printed object is refused here, at file level
            kind = "jsonl"  # JSON Lines named .json, as `datasets` reads it
        if kind == "json":
            size, ranges = plan_json_array(str(path), chunk_bytes)
            sources.append(SourceFile(str(path), size))
            flush_txt()
            base = len(chunks)
            chunks.extend(
                Chunk(base + i, kind, (str(path),), s, e, index, e - s) for i, (s, e, index) in enumerate(ranges)
            )
            continue
        if kind == "jsonl":
            source, ranges = _plan_jsonl(path, chunk_bytes)
            sources.append(source)
            flush_txt()
            base = len(chunks)
            chunks.extend(
                Chunk(base + i, kind, (source.path,), s, e, line, e - s) for i, (s, e, line) in enumerate(ranges)
            )
            continue
        with reading(str(path)), open(path, "rb") as fh:
            fh.read(1)  # unreadable inputs fail here, before any work (their sha256 comes later)
            source = SourceFile(str(path), os.fstat(fh.fileno()).st_size)
        sources.append(source)
        if kind == "txt":
            if txt_run and sum(s.n_bytes for s in txt_run) + source.n_bytes > chunk_bytes:
                flush_txt()
            txt_run.append(source)
            continue
        flush_txt()
        if kind in ("parquet", "arrow"):
            base = len(chunks)
            groups = plan_parquet(path, chunk_bytes) if kind == "parquet" else plan_arrow(source.path, chunk_bytes)
            chunks.extend(Chunk(base + i, kind, (source.path,), s, e, n_bytes=b) for i, (s, e, b) in enumerate(groups))
        else:
            chunks.append(Chunk(len(chunks), kind, (source.path,), n_bytes=source.n_bytes))
    flush_txt()
    return sources, chunks


def hash_sources(sources: Sequence[SourceFile]) -> Future[dict[str, str]]:
    """sha256 of every input, in a background thread beside the work (hashlib and reads release the GIL).

    The digests are needed only at the end (manifest) or to check an existing store or a resume."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packtool-hash")
    future = pool.submit(lambda: {s.path: _sha256(s.path) for s in sources})
    pool.shutdown(wait=False)
    return future


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with reading(path), open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _plan_jsonl(path: Path, chunk_bytes: int) -> tuple[SourceFile, list[tuple[int, int, int]]]:
    """Find chunk starts (the first line start at or after each k*chunk_bytes) and their line numbers."""
    starts: list[tuple[int, int]] = [(0, 1)]  # (byte offset, 1-based line number)
    target = chunk_bytes
    offset = 0
    lines_before = 0
    with reading(str(path)), open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            end = offset + len(block)
            while target <= end and target > 0:
                nl = block.find(b"\n", max(target - 1 - offset, 0))
                if nl < 0:
                    break  # the line continues into the next block
                cut = offset + nl + 1
                if cut > starts[-1][0]:
                    starts.append((cut, lines_before + block.count(b"\n", 0, nl + 1) + 1))
                target = max(target + chunk_bytes, cut + 1)
            lines_before += block.count(b"\n")
            offset = end
    if len(starts) > 1 and starts[-1][0] >= offset:
        starts.pop()  # the last cut sits at end of file
    ranges = [(s, starts[i + 1][0] if i + 1 < len(starts) else offset, line) for i, (s, line) in enumerate(starts)]
    return SourceFile(str(path), offset), ranges


def read_chunk(
    chunk: Chunk, *, separator: str | None = None, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> Iterator[RawRecord]:
    """Yield the records of a chunk in order: parsed JSON values / parquet or Arrow rows / texts, or errors.

    A record over `max_record_bytes` is an error record (never read whole into memory); an
    unreadable, truncated or corrupted file raises InputError (a file-level error, even with
    `--on-error skip`).
    """
    path = chunk.paths[0]
    limit = max(1, int(max_record_bytes))
    if chunk.kind == "jsonl":
        blocks = file_blocks(path, chunk.start, chunk.end)
        yield from _jsonl_lines(path, split_records(blocks, b"\n", limit), chunk.first_line, limit)
    elif chunk.kind in ("jsonl.gz", "jsonl.zst"):
        blocks = gzip_blocks(path) if chunk.kind == "jsonl.gz" else zstd_blocks(path)
        yield from _jsonl_lines(path, split_records(blocks, b"\n", limit), 1, limit)
    elif chunk.kind == "json":
        yield from json_array_records(path, chunk.start, chunk.end, chunk.first_line, limit)
    elif chunk.kind == "parquet":
        yield from parquet_rows(path, chunk.start, chunk.end, limit)
    elif chunk.kind == "arrow":
        yield from arrow_rows(path, chunk.start, chunk.end, limit)
    elif chunk.kind == "txt":
        for txt in chunk.paths:
            yield from _txt_records(txt, separator, limit)
    else:
        raise InputError(f"unknown chunk kind {chunk.kind!r}", path, hint="this is a bug")


def _jsonl_lines(path: str, pieces: Iterator[bytes | TooLong], first_line: int, limit: int) -> Iterator[RawRecord]:
    loads, error = _loads, _JSONError
    for line, piece in enumerate(pieces, first_line):
        if isinstance(piece, TooLong):
            yield RawRecord(path, line, error=too_long_reason(piece.n_bytes, limit))
            continue
        if line == 1 and piece.startswith(BOM):  # a UTF-8 byte order mark starts the file, not the record
            piece = piece[len(BOM) :]
        try:
            yield RawRecord(path, line, loads(piece))
        except error as exc:
            if not piece.strip():
                continue  # a blank line is not a record
            message = str(exc)
            reason = "invalid UTF-8" if "utf-8" in message.lower() else f"malformed JSON ({message})"
            yield RawRecord(path, line, error=reason)


def _txt_records(path: str, separator: str | None, limit: int) -> Iterator[RawRecord]:
    if not separator:
        size = os.path.getsize(path)
        if size > limit:
            yield RawRecord(path, 1, error=too_long_reason(size, limit))
            return
        with reading(path):
            yield _txt_record(path, 1, Path(path).read_bytes(), strip_bom=True)
        return
    sep = separator.encode("utf-8")
    line = 1
    for i, piece in enumerate(split_records(file_blocks(path), sep, limit)):
        if isinstance(piece, TooLong):
            yield RawRecord(path, line, error=too_long_reason(piece.n_bytes, limit))
            line += piece.newlines + sep.count(b"\n")
            continue
        yield _txt_record(path, line, piece, strip_bom=i == 0)
        line += piece.count(b"\n") + sep.count(b"\n")


def _txt_record(path: str, line: int, data: bytes, strip_bom: bool) -> RawRecord:
    if strip_bom and data.startswith(BOM):
        data = data[len(BOM) :]
    try:
        return RawRecord(path, line, PlainText(data.decode("utf-8")))
    except UnicodeDecodeError as exc:
        return RawRecord(path, line + data.count(b"\n", 0, exc.start), error="invalid UTF-8")


def get_field(value: Any, dotted: str) -> tuple[Any, str | None]:
    """Walk a dotted path (`a.b.c`) through nested dicts: (value, None) or (None, reason)."""
    if type(value) is dict and dotted in value and "." not in dotted:  # the common case: no split
        return value[dotted], None
    current = value
    for depth, key in enumerate(dotted.split(".")):
        if not isinstance(current, dict):
            where = ".".join(dotted.split(".")[:depth]) or "record"
            return None, f"{where} is not an object (got {type(current).__name__}), cannot read field {dotted!r}"
        if key not in current:
            return None, f"missing field {dotted!r}"
        current = current[key]
    return current, None


def get_text_field(value: Any, dotted: str) -> tuple[str | None, str | None]:
    """A dotted field that must be a string: (text, None) or (None, reason)."""
    got, reason = get_field(value, dotted)
    if reason is not None:
        return None, reason
    if not isinstance(got, str):
        return None, f"field {dotted!r} is not a string (got {type(got).__name__})"
    return got, None
