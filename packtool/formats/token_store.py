"""The token store: every byte of `tokens.bin`, `tokens.boundaries`, `tokens.loss`, `manifest.json`.

A headerless binary is only safe when its reader checks it against a manifest (datatrove's
reader trusts a dtype in a text file it never checks). Ours checks format name, version,
dtype, sizes and, on request, sha256 of every file before handing out a memory map.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import FormatError
from packtool.formats import jsontext
from packtool.formats.atomic import (
    atomic_directory,
    dead_siblings,
    recover_directory,
    replace_directory,
    write_bytes_atomic,
)
from packtool.formats.faults import fault_point
from packtool.formats.files import HashedFile, check_file_records, file_records, sha256_bytes
from packtool.formats.media import MEDIA_FILES, VISION, MediaTable, MediaWriter, check_vision_key
from packtool.formats.preference import PREFERENCE, preference_pairs
from packtool.formats.preference import PREFERENCE_LAYOUT as PREFERENCE_LAYOUT  # re-exported
from packtool.formats.preference import preference_key as preference_key  # re-exported
from packtool.formats.sidefiles import SideFileError, read_side_file

FORMAT_NAME = "packtool.tokens"
FORMAT_VERSION = 1
TOKENS_BIN = "tokens.bin"
BOUNDARIES = "tokens.boundaries"
LOSS = "tokens.loss"
MANIFEST = "manifest.json"
REJECTS = "rejects.jsonl"
BOUNDARY_DTYPE = np.dtype("<i8")
LOSS_DTYPE = np.dtype("u1")
#: the only token dtypes, by their manifest name (little-endian on disk)
TOKEN_DTYPES: dict[str, np.dtype] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def dtype_for_max_id(max_id: int) -> np.dtype:
    """`uint16` when every id the tokenizer can emit fits, else `uint32`."""
    if max_id < 0 or max_id >= 2**32:
        raise FormatError(f"token id {max_id} does not fit uint32, tokenizer, use a vocabulary below 2**32")
    return TOKEN_DTYPES["uint16"] if max_id <= 65535 else TOKEN_DTYPES["uint32"]


def dtype_name(dtype: np.dtype) -> str:
    """The manifest's name for a token dtype (`uint16` / `uint32`)."""
    return "uint16" if np.dtype(dtype).itemsize == 2 else "uint32"


def parse_dtype(name: object, where: str) -> np.dtype:
    if name not in TOKEN_DTYPES:
        raise FormatError(f"unknown token dtype {name!r}, {where}, expected uint16 or uint32")
    return TOKEN_DTYPES[str(name)]


@dataclass(frozen=True)
class StoreMark:
    """Where a store being written stood after some appends: counts, and each file's size and sha256 so far.

    A resumable writer journals one mark per unit of work; `resume_token_store` reopens the files at
    the last mark they still match, so a re-run continues instead of starting over.
    """

    n_documents: int
    n_tokens: int
    n_target_tokens: int
    files: dict[str, tuple[int, str]]  # name -> (bytes, sha256 of those first bytes)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "files": {k: list(v) for k, v in self.files.items()}}

    @classmethod
    def from_json(cls, data: Any) -> StoreMark:
        """Parse a journaled mark; FormatError when it is not one."""
        try:
            files = {str(k): (int(v[0]), str(v[1])) for k, v in data["files"].items()}
            return cls(int(data["n_documents"]), int(data["n_tokens"]), int(data["n_target_tokens"]), files)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise FormatError(f"malformed store mark ({exc}), journal, the run starts over") from exc


class TokenStoreWriter:
    """Streams documents into a (staging) directory; `finish` writes the manifest last.

    The manifest is the commit record: a directory without one is never a store. Every file's
    sha256 is computed while it is written, so finishing never reads the data back. A loss file
    is kept only when some token is not a target, as the contract says (`with_loss=False` when
    every token is known to be a target: nothing is written for it at all).
    """

    def __init__(
        self,
        directory: Path,
        dtype: np.dtype,
        *,
        with_loss: bool = True,
        with_rejects: bool = False,
        with_media: bool = False,
        _resume: tuple[StoreMark, dict[str, Any]] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        names = [TOKENS_BIN, BOUNDARIES] + ([LOSS] if with_loss else []) + ([REJECTS] if with_rejects else [])
        mark, digests = _resume if _resume is not None else (StoreMark(0, 0, 0, {}), {})
        self._files = {n: HashedFile(self.directory / n, digests.get(n), mark.files.get(n, (0, ""))[0]) for n in names}
        self.n_tokens = mark.n_tokens
        self.n_documents = mark.n_documents
        self.n_target_tokens = mark.n_target_tokens
        self.finished: dict[str, Any] | None = None
        #: a vision store's images (`media.add(doc, ...)`, doc a global document index); None for text
        self.media = MediaWriter(self.directory, _resume=(mark.files, digests)) if with_media else None

    def append(self, ids: np.ndarray, lengths: np.ndarray, loss: np.ndarray | None = None) -> None:
        """Append documents: `ids` concatenated, `lengths` per document, `loss` per token (1 = target)."""
        ids = np.ascontiguousarray(ids, dtype=self.dtype)
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != ids.size:
            raise FormatError(
                f"document lengths sum to {int(lengths.sum())} but {ids.size} ids were given, token store writer, this is a bug"
            )
        if loss is not None and loss.size != ids.size:
            raise FormatError(f"{loss.size} loss entries for {ids.size} ids, token store writer, this is a bug")
        ends = self.n_tokens + np.cumsum(lengths, dtype=np.int64)
        self._files[TOKENS_BIN].write(ids)
        self._files[BOUNDARIES].write(ends.astype(BOUNDARY_DTYPE, copy=False))
        targets = ids.size if loss is None else int(np.count_nonzero(loss))
        if LOSS in self._files:
            self._files[LOSS].write(
                np.ones(ids.size, LOSS_DTYPE) if loss is None else np.ascontiguousarray(loss, dtype=LOSS_DTYPE)
            )
        elif targets != ids.size:
            raise FormatError("non-target tokens given to a writer opened without a loss file, this is a bug")
        self.n_tokens += int(ids.size)
        self.n_documents += int(lengths.size)
        self.n_target_tokens += targets

    def append_rejects(self, data: bytes) -> None:
        """Append lines of `rejects.jsonl` (a writer opened with `with_rejects=True`)."""
        if data:
            self._files[REJECTS].write(data)

    def mark(self) -> StoreMark:
        """Counts and each file's size and sha256 now (cheap: the running digests are copied).

        The files are flushed first, so a killed process leaves at least these bytes in them."""
        for f in self._files.values():
            f.fh.flush()
        files = {n: (f.size, f.digest.copy().hexdigest()) for n, f in self._files.items()}
        files.update(self.media.mark() if self.media is not None else {})
        return StoreMark(self.n_documents, self.n_tokens, self.n_target_tokens, files)

    def close(self) -> None:
        for f in self._files.values():
            if not f.fh.closed:
                f.fh.close()
        if self.media is not None:
            self.media.close()

    def finish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Close the files, drop an all-ones loss file (a preference store keeps it: its readers find each pair's
        prompt from it), write `manifest.json` with the hashes taken while writing."""
        fault_point("tokens.store:fsync")
        for f in self._files.values():
            f.fh.flush()
            os.fsync(f.fh.fileno())
        self.close()
        if LOSS in self._files and self.n_target_tokens == self.n_tokens and PREFERENCE not in manifest:
            (self.directory / LOSS).unlink()
            del self._files[LOSS]
        names = [TOKENS_BIN, BOUNDARIES] + [n for n in (LOSS, REJECTS) if n in self._files]
        extra = [REJECTS] if REJECTS not in self._files and (self.directory / REJECTS).exists() else []
        records = {n: {"bytes": self._files[n].size, "sha256": self._files[n].digest.hexdigest()} for n in names}
        records.update(file_records(self.directory, extra))  # written by hand beside the writer (merge)
        manifest = self._vision(manifest, records)
        full = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            **manifest,
            "dtype": dtype_name(self.dtype),
            "n_documents": self.n_documents,
            "n_tokens": self.n_tokens,
            "n_target_tokens": self.n_target_tokens,
            "files": {n: records[n] for n in [TOKENS_BIN, BOUNDARIES, LOSS, REJECTS, *MEDIA_FILES] if n in records},
        }
        fault_point("tokens.store:manifest")
        write_bytes_atomic(self.directory / MANIFEST, (json.dumps(full, indent=2, sort_keys=False) + "\n").encode())
        fault_point("tokens.store:manifest-written")
        self.finished = full
        return full

    def _vision(self, manifest: dict[str, Any], records: dict[str, Any]) -> dict[str, Any]:
        """The manifest with its `vision` counts filled from the media writer, the media files recorded."""
        if self.media is None and VISION not in manifest:
            return manifest
        if not isinstance(manifest.get(VISION), dict):
            raise FormatError(f"a store with images finished without its {VISION!r} object, this is a bug")
        if self.media is None:  # a MediaWriter used beside this writer wrote them (its counts are in the key)
            records.update(file_records(self.directory, list(MEDIA_FILES)))
            return manifest
        records.update(self.media.close())
        return {**manifest, VISION: {**manifest[VISION], **self.media.counts()}}


@contextlib.contextmanager
def write_token_store(
    final: str | os.PathLike[str], dtype: np.dtype, *, with_loss: bool = True, with_media: bool = False
) -> Iterator[TokenStoreWriter]:
    """A `TokenStoreWriter` on a hidden staging directory that replaces `final` only on success.

    The body appends documents and calls `finish(manifest)`; on any exception (or a body that never
    finishes) the staging directory is removed and `final` is left exactly as it was. A swap that a
    killed writer left beside `final` is repaired first (every writer: tokenize, merge).
    """
    if Path(final).parent.is_dir():
        recover_token_store(final)
    with atomic_directory(final) as staging:
        writer = TokenStoreWriter(staging, dtype, with_loss=with_loss, with_media=with_media)
        try:
            yield writer
        finally:
            writer.close()
        if writer.finished is None:
            raise FormatError(f"token store writer for {final} was closed without a manifest, this is a bug")


def commit_token_store(staging: Path, final: Path) -> None:
    """Move a finished staging store (its manifest written) into place, replacing `final` whole."""
    if not (Path(staging) / MANIFEST).is_file():
        raise FormatError(f"staging store {staging} has no {MANIFEST}, token store writer, this is a bug")
    replace_directory(Path(staging), Path(final))


#: every file a token store may hold; a directory holding anything else is not (only) a store
STORE_FILES = frozenset({TOKENS_BIN, BOUNDARIES, LOSS, MANIFEST, REJECTS, *MEDIA_FILES})


#: the largest manifest or metadata file read (a manifest lists its inputs: ~300 bytes each; a pack store's
#: metadata holds one line per split): a link to /dev/zero or a sparse multi-GB file is refused unread
MAX_STORE_JSON_BYTES = 256 << 20


def _manifest_text(mpath: Path) -> str:
    """`manifest.json`'s text, bounded (SideFileError, OSError, UnicodeDecodeError otherwise)."""
    return read_side_file(mpath, MAX_STORE_JSON_BYTES).decode("utf-8")


def is_token_store(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a directory whose committed manifest says `packtool.tokens` (contents unchecked)."""
    mpath = Path(path) / MANIFEST
    try:
        manifest = jsontext.loads(_manifest_text(mpath))
    except (OSError, ValueError):  # SideFileError and UnicodeDecodeError are ValueErrors
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT_NAME


def foreign_files(path: str | os.PathLike[str]) -> list[str]:
    """Names in the directory `path` that no token store writes (sorted)."""
    return sorted(p.name for p in Path(path).iterdir() if p.name not in STORE_FILES)


def recover_token_store(final: str | os.PathLike[str]) -> str | None:
    """Finish or undo the swap a killed writer left beside `final`, then remove the staging directories
    of killed writers (SIGKILL skips cleanup). Call it under the output's lock; returns what it repaired."""
    done = recover_directory(final, is_token_store)
    for path in dead_siblings(Path(final), "tmp"):
        shutil.rmtree(path, ignore_errors=True)
    return done


@dataclass
class TokenStore:
    """A validated, memory-mapped token store. Arrays are read-only views of the files."""

    path: Path
    manifest: dict[str, Any]
    dtype: np.dtype
    tokens: np.ndarray
    boundaries: np.ndarray
    loss: np.ndarray | None
    _starts: np.ndarray | None = field(default=None, repr=False)
    _media: MediaTable | None = field(default=None, repr=False)

    @property
    def media(self) -> MediaTable | None:
        """The store's images (`formats.media`), validated on first use; None for a text-only store."""
        if self._media is None and VISION in self.manifest:
            self._media = MediaTable.open(self.path, self.manifest, self.boundaries)
        return self._media

    @property
    def n_documents(self) -> int:
        return int(self.boundaries.size)

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def starts(self) -> np.ndarray:
        """int64 start offset of every document (the boundaries shifted by one)."""
        if self._starts is None:
            starts = np.zeros(self.boundaries.size, np.int64)
            starts[1:] = self.boundaries[:-1]
            self._starts = starts
        return self._starts

    @property
    def lengths(self) -> np.ndarray:
        """int64 token length of every document."""
        return np.asarray(self.boundaries, np.int64) - self.starts

    def document(self, index: int) -> np.ndarray:
        return self.tokens[int(self.starts[index]) : int(self.boundaries[index])]

    @property
    def manifest_sha256(self) -> str:
        """sha256 of `manifest.json` as it is on disk: a pack store records it to name its source."""
        return sha256_bytes((self.path / MANIFEST).read_bytes())

    @property
    def tokenizer_name(self) -> str:
        return str(self.manifest["tokenizer"]["name"])

    @property
    def preference_pairs(self) -> int | None:
        """Pairs of a preference store (documents 2i chosen, 2i+1 rejected), None for any other store.

        Decided ONLY from the manifest's top-level `preference` key; a key whose pair count disagrees with
        `n_documents` (which must be twice it) is a FormatError, never a guess.
        """
        return preference_pairs(self.manifest, self.n_documents, self.path)


def read_manifest(path: Path) -> dict[str, Any]:
    """Parse and check `manifest.json` of a token store (format name and version)."""
    mpath = Path(path) / MANIFEST
    if not mpath.is_file():
        raise FormatError(
            f"no {MANIFEST} in {path}, not a token store (or an interrupted run), re-run `packtool tokenize`"
        )
    try:
        manifest = jsontext.loads(_manifest_text(mpath))
    except ValueError as exc:  # not UTF-8 or JSON, or never read (SideFileError: a device, over the limit)
        kind = "read" if isinstance(exc, SideFileError) else "valid JSON"
        raise FormatError(f"{MANIFEST} is not {kind} ({exc}), {mpath}, re-run `packtool tokenize`") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise FormatError(
            f"{mpath} is not a packtool token store manifest (format={manifest.get('format') if isinstance(manifest, dict) else None!r}), expected format {FORMAT_NAME!r}"
        )
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise FormatError(
            f"token store format_version must be an integer, got {version!r} ({type(version).__name__}), {mpath}, re-run `packtool tokenize`"
        )
    if version > FORMAT_VERSION or version < 1:
        raise FormatError(
            f"token store format_version {version!r} is not supported (this packtool reads {FORMAT_VERSION}), {mpath}, upgrade packtool or re-tokenize"
        )
    for key in ("tokenizer", "dtype", "n_documents", "n_tokens", "files"):
        if key not in manifest:
            raise FormatError(f"{MANIFEST} lacks {key!r}, {mpath}, re-run `packtool tokenize`")
    for key, value in manifest.items():  # sizes the files are checked against: "many" or -1 is no size
        count = key in ("n_documents", "n_tokens")
        if (count and (isinstance(value, bool) or not isinstance(value, int) or value < 0)) or (
            key in ("tokenizer", "files") and not isinstance(value, dict)
        ):
            want = "a count (an integer >= 0)" if count else "a JSON object"
            got = repr(value)[:80] if count else type(value).__name__
            raise FormatError(
                f"{MANIFEST} field {key!r} must be {want}, got {got}, {mpath}, re-run `packtool tokenize`"
            )
    return manifest


def _check_size(path: Path, expected: int, what: str) -> None:
    if not path.is_file():
        raise FormatError(f"{what} is missing, {path}, re-run `packtool tokenize`")
    got = path.stat().st_size
    if got != expected:
        raise FormatError(
            f"{what} has {got} bytes but the manifest implies {expected} (truncated or corrupted), {path}, re-run `packtool tokenize`"
        )


def open_token_store(path: str | os.PathLike[str], *, check_hashes: bool = False) -> TokenStore:
    """Open a token store after checking manifest, sizes and boundaries; hashes on request."""
    root = Path(path)
    if not root.is_dir():
        raise FormatError(f"token store {root} does not exist, check the path or run `packtool tokenize`")
    manifest = read_manifest(root)
    dtype = parse_dtype(manifest["dtype"], str(root / MANIFEST))
    n_docs, n_tokens = int(manifest["n_documents"]), int(manifest["n_tokens"])
    _check_size(root / TOKENS_BIN, n_tokens * dtype.itemsize, TOKENS_BIN)
    _check_size(root / BOUNDARIES, n_docs * BOUNDARY_DTYPE.itemsize, BOUNDARIES)
    has_loss = LOSS in manifest["files"]
    media = list(MEDIA_FILES) if check_vision_key(manifest, root / MANIFEST) is not None else []
    if has_loss:
        _check_size(root / LOSS, n_tokens, LOSS)
    check_file_records(
        root,
        manifest["files"],
        [TOKENS_BIN, BOUNDARIES] + ([LOSS] if has_loss or (root / LOSS).exists() else []) + media,
        check_hashes=check_hashes,
        where=str(root / MANIFEST),
        fix="re-run `packtool tokenize`",
    )
    tokens = _memmap(root / TOKENS_BIN, dtype, n_tokens)
    boundaries = _memmap(root / BOUNDARIES, BOUNDARY_DTYPE, n_docs)
    loss = _memmap(root / LOSS, LOSS_DTYPE, n_tokens) if has_loss else None
    if n_docs:
        if int(boundaries[-1]) != n_tokens:
            raise FormatError(
                f"last document boundary {int(boundaries[-1])} != n_tokens {n_tokens}, {root / BOUNDARIES}, re-run `packtool tokenize`"
            )
        if int(boundaries[0]) < 0 or (n_docs > 1 and bool(np.any(np.diff(boundaries) < 0))):
            raise FormatError(
                f"document boundaries are not non-decreasing, {root / BOUNDARIES}, re-run `packtool tokenize`"
            )
    elif n_tokens:
        raise FormatError(f"{n_tokens} tokens but no documents, {root / MANIFEST}, re-run `packtool tokenize`")
    return TokenStore(root, manifest, dtype, tokens, boundaries, loss)


def _memmap(path: Path, dtype: np.dtype, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))
