"""The images of a token store: every byte of `images.rows`, `images.index`, `images.bin`.

A vision token store holds each unique encoded image once (deduplicated by sha256, in first-seen
order) and one row per image occurrence, so the store is self-contained: moved or shared, nothing is
re-resolved. The files are headerless little-endian records, checked against the manifest's `vision`
object and `files` map whenever they are opened:

- `images.rows`  one `ROW_DTYPE` record (48 bytes) per occurrence, in document then offset order:
  `doc` (document index), `offset` (token offset of its first image token in the document),
  `n_tokens`, `grid` (t, h, w), `n_patches`, `media` (index of its unique bytes);
- `images.index` one `INDEX_DTYPE` record (40 bytes) per unique image: `end` (byte end in images.bin),
  `sha256` (its 32-byte digest);
- `images.bin`   the unique encoded images (PNG, JPEG, ... as read), concatenated.

A million occurrences of a million distinct images cost 88 MB of records plus the encoded bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import FormatError
from packtool.formats import jsontext
from packtool.formats.files import HashedFile
from packtool.formats.sidefiles import SideFileError, read_side_file

ROWS = "images.rows"
INDEX = "images.index"
BLOBS = "images.bin"
#: every media file, in the order the manifest's `files` map lists them
MEDIA_FILES = (ROWS, INDEX, BLOBS)
#: the manifest key of a vision token store
VISION = "vision"
#: the token store's manifest (token_store.MANIFEST: this module sits below token_store; a test ties them)
_MANIFEST = "manifest.json"
_MANIFEST_LIMIT = 256 << 20
ROW_DTYPE = np.dtype(
    [
        ("doc", "<i8"),
        ("offset", "<i8"),
        ("n_tokens", "<i4"),
        ("grid", "<i4", (3,)),
        ("n_patches", "<i8"),
        ("media", "<i8"),
    ]
)
INDEX_DTYPE = np.dtype([("end", "<i8"), ("sha256", "V32")])
#: the counts the writer fills into the manifest's `vision` object
COUNTS = ("n_images", "n_unique", "n_image_tokens", "n_patches")
_FIX = "re-run `packtool tokenize`"


class MediaWriter:
    """Appends image occurrences (and each unique image's bytes once) into `directory`.

    `add` is called in document then offset order; `close` writes the last bytes and returns the
    files' manifest records; `vision(...)` is the manifest's `vision` object with the counts. A
    resumable writer journals `mark()` and is reopened with `_resume` (`token_resume` does it)."""

    def __init__(self, directory: Path, *, _resume: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None) -> None:
        self.directory = Path(directory)
        sizes, digests = _resume if _resume is not None else ({}, {})
        self._files = {
            n: HashedFile(self.directory / n, digests.get(n), int(sizes.get(n, (0, ""))[0])) for n in MEDIA_FILES
        }
        self._seen: dict[bytes, int] = {}
        self.n_images = self._files[ROWS].size // ROW_DTYPE.itemsize
        self.n_image_tokens = 0
        self.n_patches = 0
        self._last = (-1, -1)
        self._blob_end = self._files[BLOBS].size
        if _resume is not None:
            self._reload()

    def _reload(self) -> None:
        """The dedup map, the counts and the last row of a resumed writer, from the bytes kept."""
        index = np.fromfile(self.directory / INDEX, INDEX_DTYPE, self._files[INDEX].size // INDEX_DTYPE.itemsize)
        self._seen = {bytes(d): i for i, d in enumerate(index["sha256"])}
        rows = np.fromfile(self.directory / ROWS, ROW_DTYPE, self.n_images)
        self.n_image_tokens = int(rows["n_tokens"].sum(dtype=np.int64))
        self.n_patches = int(rows["n_patches"].sum(dtype=np.int64))
        if rows.size:
            self._last = (int(rows["doc"][-1]), int(rows["offset"][-1] + rows["n_tokens"][-1]))

    @property
    def n_unique(self) -> int:
        return len(self._seen)

    def add(
        self, doc: int, offset: int, n_tokens: int, grid: tuple[int, int, int], n_patches: int, data: bytes
    ) -> None:
        """One image occurrence: its document, token offset and count, grid, patches and encoded bytes."""
        doc, offset, n_tokens, n_patches = int(doc), int(offset), int(n_tokens), int(n_patches)
        if doc < 0 or offset < 0 or n_tokens < 1 or n_patches < 0 or len(tuple(grid)) != 3 or min(grid) < 0:
            raise FormatError(
                f"image row (doc {doc}, offset {offset}, {n_tokens} tokens, grid {tuple(grid)}, {n_patches} patches) "
                "is not valid, media writer, this is a bug"
            )
        if (doc, offset) < self._last or (doc == self._last[0] and offset < self._last[1]):
            raise FormatError(
                f"image at document {doc} offset {offset} comes after one ending at document {self._last[0]} "
                f"offset {self._last[1]} (rows go in document then offset order, never overlapping), media writer, "
                "this is a bug"
            )
        digest = hashlib.sha256(data).digest()
        media = self._seen.get(digest)
        if media is None:
            media = self._seen[digest] = len(self._seen)
            self._files[BLOBS].write(data)
            self._blob_end += len(data)
            entry = np.zeros(1, INDEX_DTYPE)
            entry["end"] = self._blob_end
            entry["sha256"] = np.frombuffer(digest, "V32")
            self._files[INDEX].write(entry)
        row = np.zeros(1, ROW_DTYPE)
        row[0] = (doc, offset, n_tokens, tuple(int(g) for g in grid), n_patches, media)
        self._files[ROWS].write(row)
        self.n_images += 1
        self.n_image_tokens += n_tokens
        self.n_patches += n_patches
        self._last = (doc, offset + n_tokens)

    def mark(self) -> dict[str, tuple[int, str]]:
        """Each file's size and sha256 so far (flushed first), for a resumable writer's journal."""
        for f in self._files.values():
            f.fh.flush()
        return {n: (f.size, f.digest.copy().hexdigest()) for n, f in self._files.items()}

    def close(self) -> dict[str, dict[str, Any]]:
        """Flush, fsync and close the files; their manifest `files` records (bytes, sha256)."""
        for f in self._files.values():
            if not f.fh.closed:
                f.fh.flush()
                os.fsync(f.fh.fileno())
                f.fh.close()
        return {n: {"bytes": f.size, "sha256": f.digest.hexdigest()} for n, f in self._files.items()}

    def vision(self, family: str, processor: Mapping[str, Any], image_token_id: int) -> dict[str, Any]:
        """The manifest's `vision` object: the processor's identity and this writer's counts."""
        return {
            "family": str(family),
            "processor": dict(processor),
            "image_token_id": int(image_token_id),
            **self.counts(),
        }

    def counts(self) -> dict[str, int]:
        return {
            "n_images": self.n_images,
            "n_unique": self.n_unique,
            "n_image_tokens": self.n_image_tokens,
            "n_patches": self.n_patches,
        }


def check_vision_key(manifest: Mapping[str, Any], where: object) -> dict[str, Any] | None:
    """The manifest's `vision` object, checked, or None for a text-only store.

    A store claiming vision without its media files, or holding media files without the key, is refused."""
    files = manifest.get("files")
    recorded = [n for n in MEDIA_FILES if isinstance(files, dict) and n in files]
    vision = manifest.get(VISION)
    if vision is None:
        if recorded:
            raise FormatError(
                f"the files map records {', '.join(recorded)} but the manifest has no {VISION!r} object, {where}, {_FIX}"
            )
        return None
    if not isinstance(vision, dict):
        raise FormatError(f"manifest {VISION!r} must be a JSON object, got {type(vision).__name__}, {where}, {_FIX}")
    if len(recorded) != len(MEDIA_FILES):
        absent = [n for n in MEDIA_FILES if n not in recorded]
        raise FormatError(
            f"the manifest claims images ({VISION!r}) but its files map lacks {', '.join(absent)}, {where}, {_FIX}"
        )
    for key in ("image_token_id", *COUNTS):
        value = vision.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise FormatError(
                f"manifest {VISION}.{key} must be an integer >= 0, got {json.dumps(value)[:40]}, {where}, {_FIX}"
            )
    if not isinstance(vision.get("family"), str) or not isinstance(vision.get("processor"), dict):
        raise FormatError(
            f"manifest {VISION} must name its 'family' (a string) and 'processor' (an object), {where}, {_FIX}"
        )
    return vision


@dataclass(frozen=True)
class MediaTable:
    """The image occurrences of a token store, memory-mapped and validated (`open`)."""

    path: Path
    vision: dict[str, Any]
    rows: np.ndarray  # ROW_DTYPE [n_images]
    index: np.ndarray  # INDEX_DTYPE [n_unique]
    blobs: np.ndarray  # uint8 [bytes]
    doc: np.ndarray  # int64 [n_images] (a contiguous copy: searched per pack)
    offset: np.ndarray  # int64 [n_images]
    n_tokens: np.ndarray  # int32 [n_images]
    grid: np.ndarray  # int32 [n_images, 3]
    n_patches: np.ndarray  # int64 [n_images]
    media: np.ndarray  # int64 [n_images]

    @classmethod
    def open(
        cls,
        store_dir: str | os.PathLike[str],
        manifest: Mapping[str, Any] | None = None,
        boundaries: np.ndarray | None = None,
    ) -> MediaTable | None:
        """The media of the token store at `store_dir`; None for a text-only store; FormatError if corrupt.

        `manifest` (already read) and `boundaries` (document ends, to check every row lies inside its
        document) are optional: without them the manifest is read here and rows are checked among themselves."""
        root = Path(store_dir)
        if manifest is None:
            manifest = _read_manifest(root)
        where = root / _MANIFEST
        vision = check_vision_key(manifest, where)
        if vision is None:
            return None
        files = manifest["files"]
        n, u = int(vision["n_images"]), int(vision["n_unique"])
        rows = _map(root / ROWS, ROW_DTYPE, n, files)
        index = _map(root / INDEX, INDEX_DTYPE, u, files)
        n_bytes = int(index["end"][-1]) if u else 0
        blobs = _map(root / BLOBS, np.dtype("u1"), n_bytes, files)
        table = cls(
            root,
            vision,
            rows,
            index,
            blobs,
            np.ascontiguousarray(rows["doc"]),
            rows["offset"],
            rows["n_tokens"],
            rows["grid"],
            rows["n_patches"],
            rows["media"],
        )
        table._check(boundaries)
        return table

    def __len__(self) -> int:
        return int(self.rows.size)

    @property
    def image_token_id(self) -> int:
        return int(self.vision["image_token_id"])

    def data(self, i: int) -> bytes:
        """Encoded bytes of image occurrence `i`, checked against its sha256 (FormatError naming images.bin)."""
        u = int(self.media[i])
        lo = int(self.index["end"][u - 1]) if u else 0
        data = bytes(self.blobs[lo : int(self.index["end"][u])])
        if hashlib.sha256(data).digest() != bytes(self.index["sha256"][u]):
            raise FormatError(
                f"image {u} (bytes {lo}..{lo + len(data)}) does not match its sha256 (corrupted), "
                f"{self.path / BLOBS}, {_FIX}"
            )
        return data

    def of_documents(self, docs: np.ndarray) -> np.ndarray:
        """Occurrence indices of these documents' images: documents in the order given, each in offset order."""
        docs = np.asarray(docs, np.int64)
        lo = np.searchsorted(self.doc, docs, side="left")
        hi = np.searchsorted(self.doc, docs, side="right")
        return runs(lo, hi - lo)

    def _check(self, boundaries: np.ndarray | None) -> None:
        """Every structural promise of the files, vectorised; the first broken one is a FormatError."""
        v, rows_at, index_at = self.vision, self.path / ROWS, self.path / INDEX
        ends = np.asarray(self.index["end"], np.int64)
        if ends.size and (int(ends[0]) < 0 or bool(np.any(np.diff(ends) < 0))):
            raise FormatError(f"image byte ends are not non-decreasing (corrupted), {index_at}, {_FIX}")
        n = len(self)
        if not n:
            _counts_match(
                v, {"n_images": 0, "n_unique": int(ends.size), "n_image_tokens": 0, "n_patches": 0}, self.path
            )
            return
        doc, off, ntok, media = self.doc, np.asarray(self.offset), np.asarray(self.n_tokens), np.asarray(self.media)
        bad = (doc < 0) | (off < 0) | (ntok < 1) | (np.asarray(self.n_patches) < 0) | np.any(self.grid < 0, axis=1)
        bad |= (media < 0) | (media >= ends.size)
        same = doc[1:] == doc[:-1]
        order = (doc[1:] < doc[:-1]) | (same & (off[1:] < off[:-1] + ntok[:-1]))
        bad[1:] |= order
        # first-seen order: each unique image is first used right after the ones before it
        bad |= media > np.maximum.accumulate(np.concatenate([[-1], media[:-1]])) + 1
        if boundaries is not None:  # every image inside its document
            b = np.concatenate([np.zeros(1, np.int64), np.asarray(boundaries, np.int64)])
            d = np.clip(doc, 0, max(b.size - 2, 0))
            bad |= (doc >= b.size - 1) | (b[d] + off + ntok > b[np.minimum(d + 1, b.size - 1)])
        if bad.any():
            i = int(np.argmax(bad))
            raise FormatError(
                f"image row {i} (document {int(doc[i])}, offset {int(off[i])}, {int(ntok[i])} tokens, media "
                f"{int(media[i])}) is out of range, out of order or overlaps the one before (corrupted), {rows_at}, {_FIX}"
            )
        if int(media.max()) + 1 != ends.size:
            raise FormatError(f"{ends.size} unique images but the rows use {int(media.max()) + 1}, {index_at}, {_FIX}")
        got = {
            "n_images": n,
            "n_unique": int(ends.size),
            "n_image_tokens": int(ntok.sum(dtype=np.int64)),
            "n_patches": int(np.asarray(self.n_patches).sum(dtype=np.int64)),
        }
        _counts_match(v, got, self.path)


def runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`starts[i] + 0..lengths[i]-1`, concatenated (int64)."""
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    begin = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, np.int64) - begin, lengths) + np.arange(total, dtype=np.int64)


def _counts_match(vision: Mapping[str, Any], got: Mapping[str, int], path: Path) -> None:
    for key, value in got.items():
        if int(vision[key]) != value:
            raise FormatError(
                f"manifest {VISION}.{key} is {vision[key]} but the media files hold {value}, {path / _MANIFEST}, {_FIX}"
            )


def _map(path: Path, dtype: np.dtype, count: int, files: Mapping[str, Any]) -> np.ndarray:
    """A read-only map of `count` records, after checking the size the manifest records and implies."""
    expected = count * dtype.itemsize
    recorded = files[path.name].get("bytes") if isinstance(files.get(path.name), dict) else None
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError as exc:
        raise FormatError(f"{path.name} cannot be read ({exc.strerror or exc}), {path}, {_FIX}") from exc
    if size is None:
        raise FormatError(f"{path.name} is missing, {path}, {_FIX}")
    if size != expected or recorded != expected:
        raise FormatError(
            f"{path.name} has {size} bytes (recorded {recorded}) but the manifest's counts imply {expected} "
            f"(truncated or corrupted), {path}, {_FIX}"
        )
    if count == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def _read_manifest(root: Path) -> dict[str, Any]:
    path = root / _MANIFEST
    try:
        manifest = jsontext.loads(read_side_file(path, _MANIFEST_LIMIT).decode("utf-8"))
    except (OSError, ValueError) as exc:  # SideFileError, UnicodeDecodeError, JSONDecodeError are ValueErrors
        kind = "read" if isinstance(exc, (OSError, SideFileError)) else "valid JSON"
        raise FormatError(f"{_MANIFEST} is not {kind} ({exc}), {path}, {_FIX}") from None
    if not isinstance(manifest, dict):
        raise FormatError(f"{path} is not a token store manifest (not a JSON object), {_FIX}")
    return manifest
