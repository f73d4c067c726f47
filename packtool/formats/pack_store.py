"""The pack store: every byte under `ROOT/packed/{tokenizer_name}/` for a split S and size N.

Layout (Megatron-Bridge users know the `{split}_{N}.npy` + `{N}_metadata.jsonl` pair):
`{S}_{N}.npy` is a real 2-D `.npy` `[n_packs, N]` of token ids, and CSR companions say
which segment (document or fragment) sits where, so that the loader needs no JSON per pack.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import FormatError
from packtool.formats.atomic import atomic_file, fsync_dir, temp_sibling
from packtool.formats.files import check_file_records, file_records
from packtool.formats.token_store import parse_dtype

FORMAT_NAME = "packtool.packs"
FORMAT_VERSION = 1
SPLITS = ("training", "validation", "test")

#: companion arrays: suffix -> dtype (the comment says what each holds)
COMPANIONS: dict[str, np.dtype] = {
    "pack_offsets": np.dtype("<i8"),  # [n_packs + 1] CSR row pointer into the segment arrays
    "seg_lens": np.dtype("<i4"),  # [n_segments] tokens per segment, --pad-multiple padding included
    "seg_pad": np.dtype("<i4"),  # [n_segments] of those, how many are --pad-multiple padding (at the end)
    "seg_doc": np.dtype("<i8"),  # [n_segments] document index in the token store
    "seg_src": np.dtype("<i8"),  # [n_segments] start offset of the segment's tokens in tokens.bin
}
LOSS_DTYPE = np.dtype("u1")


def safe_name(name: str) -> str:
    """A file-system safe directory name for a tokenizer (`org/model` -> `org--model`)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name.replace("/", "--")).strip(".-")
    return cleaned or "tokenizer"


def pack_dir(root: str | os.PathLike[str], tokenizer_name: str) -> Path:
    return Path(root) / "packed" / safe_name(tokenizer_name)


def data_name(split: str, size: int) -> str:
    return f"{split}_{size}.npy"


_DATA_NAME = re.compile(r"^(?P<split>[^.]+)_(?P<size>\d+)\.npy$")


def parse_data_name(name: str) -> tuple[str, int] | None:
    """(split, N) of a `{split}_{N}.npy` file name; None for any other name (companions included)."""
    m = _DATA_NAME.match(name)
    return (m["split"], int(m["size"])) if m else None


def companion_name(split: str, size: int, what: str) -> str:
    return f"{split}_{size}.{what}.npy"


def loss_name(split: str, size: int) -> str:
    return f"{split}_{size}.loss.npy"


def metadata_name(size: int) -> str:
    return f"{size}_metadata.jsonl"


def file_names(split: str, size: int, with_loss: bool) -> list[str]:
    """Every file of one (split, size) in a fixed order."""
    names = [data_name(split, size)] + [companion_name(split, size, c) for c in COMPANIONS]
    return names + ([loss_name(split, size)] if with_loss else [])


def read_metadata(directory: Path, size: int) -> list[dict[str, Any]]:
    """All lines of `{N}_metadata.jsonl` (one object per split); [] when absent."""
    path = Path(directory) / metadata_name(size)
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FormatError(
                f"invalid JSON in pack metadata ({exc.msg}), {path}:{lineno}, re-run `packtool pack`"
            ) from exc
        if not isinstance(rec, dict) or "split" not in rec:
            raise FormatError(
                f"pack metadata line is not an object with a 'split', {path}:{lineno}, re-run `packtool pack`"
            )
        records.append(rec)
    return records


def metadata_for(directory: Path, split: str, size: int) -> dict[str, Any]:
    for rec in read_metadata(directory, size):
        if rec["split"] == split:
            version = rec.get("format_version")
            if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
                raise FormatError(
                    f"pack store format_version {version!r} is not supported (this packtool reads {FORMAT_VERSION}), {Path(directory) / metadata_name(size)}, upgrade packtool or re-pack"
                )
            return rec
    raise FormatError(
        f"no metadata line for split {split!r} at size {size}, {Path(directory) / metadata_name(size)}, run `packtool pack --split {split} --size {size}`"
    )


def write_metadata_line(directory: Path, record: dict[str, Any]) -> None:
    """Insert or replace the line of `record['split']` in `{N}_metadata.jsonl`, atomically."""
    size = int(record["pack_size"])
    kept = [r for r in read_metadata(directory, size) if r["split"] != record["split"]]
    kept.append(record)
    kept.sort(key=lambda r: (SPLITS.index(r["split"]) if r["split"] in SPLITS else len(SPLITS), str(r["split"])))
    text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in kept)
    with atomic_file(Path(directory) / metadata_name(size), "wb") as fh:
        fh.write(text.encode())  # type: ignore[attr-defined]


@dataclass
class PackSplit:
    """One (split, size) of a pack store, memory-mapped read-only and checked."""

    directory: Path
    split: str
    size: int
    metadata: dict[str, Any]
    tokens: np.ndarray  # [n_packs, N]
    pack_offsets: np.ndarray
    seg_lens: np.ndarray
    seg_pad: np.ndarray
    seg_doc: np.ndarray
    seg_src: np.ndarray
    loss: np.ndarray | None

    @property
    def n_packs(self) -> int:
        return int(self.tokens.shape[0])


def _load(path: Path, dtype: np.dtype, ndim: int) -> np.ndarray:
    if not path.is_file():
        raise FormatError(f"{path.name} is missing, {path.parent}, re-run `packtool pack`")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise FormatError(
            f"{path.name} is not a readable .npy ({exc}; truncated or corrupted), {path}, re-run `packtool pack`"
        ) from exc
    if arr.ndim != ndim or arr.dtype.kind != dtype.kind or arr.dtype.itemsize != dtype.itemsize:
        raise FormatError(
            f"{path.name} has dtype {arr.dtype} and {arr.ndim} dims, expected {dtype} with {ndim}, {path}, re-run `packtool pack`"
        )
    return arr


def open_pack_split(
    directory: str | os.PathLike[str], split: str, size: int, *, check_hashes: bool = False
) -> PackSplit:
    """Open one split at one size after checking metadata, shapes and CSR consistency."""
    d = Path(directory)
    meta = metadata_for(d, split, size)
    lpath = d / loss_name(split, size)
    check_file_records(
        d,
        meta.get("files"),
        file_names(split, size, lpath.exists()),
        check_hashes=check_hashes,
        where=f"{d / metadata_name(size)} (split {split})",
        fix="re-run `packtool pack`",
    )
    token_dtype = parse_dtype(meta.get("dtype"), str(d / metadata_name(size)))
    tokens = _load(d / data_name(split, size), token_dtype, 2)
    arrays = {c: _load(d / companion_name(split, size, c), dt, 1) for c, dt in COMPANIONS.items()}
    loss = _load(lpath, LOSS_DTYPE, 2) if lpath.exists() else None
    n_packs = int(tokens.shape[0])
    if tokens.shape[1] != size:
        raise FormatError(
            f"{data_name(split, size)} has rows of {tokens.shape[1]} tokens, expected {size}, {d}, re-run `packtool pack`"
        )
    po = arrays["pack_offsets"]
    n_seg = int(arrays["seg_lens"].size)
    if po.size != n_packs + 1 or int(po[0]) != 0 or int(po[-1]) != n_seg or bool(np.any(np.diff(po) < 0)):
        raise FormatError(
            f"pack_offsets is inconsistent with {n_packs} packs and {n_seg} segments, {d}, re-run `packtool pack`"
        )
    for c in ("seg_pad", "seg_doc", "seg_src"):
        if arrays[c].size != n_seg:
            raise FormatError(
                f"{companion_name(split, size, c)} has {arrays[c].size} entries, expected {n_seg}, {d}, re-run `packtool pack`"
            )
    if loss is not None and loss.shape != tokens.shape:
        raise FormatError(
            f"{loss_name(split, size)} has shape {loss.shape}, expected {tokens.shape}, {d}, re-run `packtool pack`"
        )
    return PackSplit(
        d,
        split,
        size,
        meta,
        tokens,
        po,
        arrays["seg_lens"],
        arrays["seg_pad"],
        arrays["seg_doc"],
        arrays["seg_src"],
        loss,
    )


def find_pack_dir(path: str | os.PathLike[str]) -> Path:
    """Resolve a `packed/{tokenizer}` dir from itself, a pack ROOT holding one tokenizer, or a `.npy` file."""
    p = Path(path)
    if p.is_file():
        if parse_data_name(p.name) is None:
            raise FormatError(
                f"{p} is neither a token store nor a pack file ({{split}}_{{N}}.npy), "
                "pass a token store directory, a pack ROOT, a packed/{tokenizer} directory or a pack .npy"
            )
        return p.parent
    if any(p.glob("*_metadata.jsonl")):
        return p
    packed = p / "packed"
    subdirs = sorted(x for x in packed.iterdir() if x.is_dir()) if packed.is_dir() else []
    if len(subdirs) == 1:
        return subdirs[0]
    if len(subdirs) > 1:
        raise FormatError(f"{packed} holds several tokenizers ({', '.join(s.name for s in subdirs)}), pass one of them")
    raise FormatError(
        f"no token store or pack store at {p} (no manifest.json, no *_metadata.jsonl), "
        "check the path, or run `packtool tokenize` / `packtool pack` first"
    )


def sizes_in(directory: Path) -> list[int]:
    out = []
    for f in Path(directory).glob("*_metadata.jsonl"):
        head = f.name.split("_", 1)[0]
        if head.isdigit():
            out.append(int(head))
    return sorted(out)


class PackSplitWriter:
    """Writes one (split, size) under hidden temp names; `commit` renames them and writes metadata LAST.

    The token (and loss) matrices are `np.lib.format.open_memmap` files filled block by block, so
    memory stays bounded whatever the corpus size. Until `commit` renames them, no reader sees
    anything; `abort` removes the temps. A stale `.loss.npy` from an earlier run is removed when
    the new split has none, so the directory never mixes two runs once the metadata line is written.
    """

    def __init__(
        self, directory: str | os.PathLike[str], split: str, size: int, dtype: np.dtype, n_packs: int, with_loss: bool
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.split, self.size, self.with_loss = split, int(size), with_loss
        self._temps: dict[str, Path] = {}
        self.tokens = self._matrix(data_name(split, size), np.dtype(dtype).newbyteorder("<"), n_packs)
        self.loss = self._matrix(loss_name(split, size), LOSS_DTYPE, n_packs) if with_loss else None

    def _temp(self, name: str) -> Path:
        tmp = temp_sibling(self.directory / name)
        self._temps[name] = tmp
        return tmp

    def _matrix(self, name: str, dtype: np.dtype, n_rows: int) -> np.ndarray:
        """A `[n_rows, size]` .npy memmap under a temp name; the caller fills EVERY row (pad included)."""
        tmp = self._temp(name)
        if n_rows == 0:  # a zero-size memmap cannot be opened; write the empty .npy directly
            empty = np.zeros((0, self.size), dtype)
            with open(tmp, "wb") as fh:
                np.lib.format.write_array(fh, empty, allow_pickle=False)
            return empty
        return np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(n_rows, self.size))

    def write_companion(self, what: str, values: np.ndarray) -> None:
        """Write one CSR companion (`pack_offsets`, `seg_lens`, ...) with its fixed dtype."""
        dtype = COMPANIONS[what]
        arr = np.ascontiguousarray(values, dtype=dtype)
        tmp = self._temp(companion_name(self.split, self.size, what))
        with open(tmp, "wb") as fh:
            np.lib.format.write_array(fh, arr, allow_pickle=False)

    def _flush(self) -> None:
        for arr in (self.tokens, self.loss):
            if isinstance(arr, np.memmap):
                arr.flush()
        self.tokens = self.loss = None  # type: ignore[assignment]  # drop the maps before renaming

    def commit(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """Fsync and rename every temp, hash the files, then write this split's metadata line."""
        self._flush()
        names = file_names(self.split, self.size, self.with_loss)
        missing = [n for n in names if n not in self._temps]
        if missing:
            self.abort()
            raise FormatError(f"pack writer did not write {', '.join(missing)}, {self.directory}, this is a bug")
        for name in names:
            with open(self._temps[name], "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(self._temps[name], self.directory / name)
        self._temps.clear()
        if not self.with_loss:
            (self.directory / loss_name(self.split, self.size)).unlink(missing_ok=True)
        fsync_dir(self.directory)
        record = {
            **metadata,
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "files": file_records(self.directory, names),
        }
        write_metadata_line(self.directory, record)
        return record

    def __enter__(self) -> PackSplitWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None or self._temps:
            self.abort()  # failed, or left without commit: the final names were never touched

    def abort(self) -> None:
        """Remove every temp file (the final names were never touched)."""
        self.tokens = self.loss = None  # type: ignore[assignment]
        for tmp in self._temps.values():
            tmp.unlink(missing_ok=True)
        self._temps.clear()
