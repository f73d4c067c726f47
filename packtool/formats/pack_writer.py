"""Writing one (split, size) of a pack store: nothing lost, nothing mixed, whatever kills the run.

Protocol (format version 2; every step has a `fault_point`):
1. take the pack directory's lock (`exclusive_output`; a second writer fails at once) and clean
   what dead runs left (`clean_pack_dir`): temps of dead pids, files of builds no metadata names;
2. check free space, then write every file under a hidden temp name (`.NAME.tmp-PID`); the
   matrices are preallocated (`posix_fallocate`) before they are memory-mapped, so a full disk
   is an ENOSPC error here, never a SIGBUS later;
3. hash the temps; the build id is a hash of those hashes, so the same bytes get the same names;
   rename each temp to its build's name `{S}_{N}.{build}[.role].npy` — the previous build's
   files are untouched, and no reader looks at the new names yet;
4. COMMIT: rewrite `{N}_metadata.jsonl` (atomic rename) with the line naming the new build;
5. point the plain `{S}_{N}.npy` at the new data file (hard link, else symlink) and remove the
   previous build's files.
A run killed anywhere before 4 leaves the previous build readable and complete; after 4, the new
one. Leftovers of a killed run are removed by the next run into the same directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import FormatError, StorageError
from packtool.formats.atomic import directories_made, fsync_dir, pid_alive, temp_sibling
from packtool.formats.faults import fault_point
from packtool.formats.files import sha256_file
from packtool.formats.locks import exclusive_output
from packtool.formats.oserrors import os_reason, write_error_message
from packtool.formats.pack_checks import VISION_COMPANIONS
from packtool.formats.pack_store import (
    ALL_COMPANIONS,
    BUILD_FILE,
    COMPANIONS,
    FORMAT_NAME,
    LEGACY_FILE,
    LOSS_DTYPE,
    PAIR_COMPANIONS,
    SINGLE_SOURCE_VERSION,
    build_id,
    companion_name,
    data_name,
    file_names,
    loss_name,
    metadata_build,
    metadata_name,
    parse_data_name,
    read_metadata,
    write_metadata_line,
)

log = logging.getLogger(__name__)

_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)$")
_METADATA = re.compile(r"^\d+_metadata\.jsonl$")
#: bytes kept free beyond what a pack needs (metadata, file-system slack)
SPACE_MARGIN = 16 << 20


def prepare_pack_dir(directory: str | os.PathLike[str]) -> Path:
    """Create the pack directory (parents included) or say in one line why it cannot be."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(
            f"cannot create the pack directory ({os_reason(exc)}), {d}, pass an --output ROOT that is a writable directory"
        ) from exc
    if not os.access(d, os.W_OK | os.X_OK):
        raise StorageError(f"the pack directory is not writable, {d}, fix its permissions or choose another --output")
    return d


@contextlib.contextmanager
def pack_dir_made(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """`prepare_pack_dir` for a run: the directories it made (ROOT, `packed/`, `packed/{tokenizer}`) are
    removed again when the run fails before writing into them (a refused overlong document, a mixture of
    tokenizers, a full disk left them behind, empty)."""
    with directories_made(Path(directory), prepare_pack_dir) as made:
        yield made


def _ours(name: str) -> bool:
    return bool(parse_data_name(name) or BUILD_FILE.match(name) or LEGACY_FILE.match(name) or _METADATA.match(name))


def clean_pack_dir(directory: Path) -> list[str]:
    """Remove what interrupted runs left in `directory` (call under its lock); returns the names removed.

    Only names packtool writes are touched: temps `.NAME.tmp-PID` of dead pids, files of builds that
    no metadata line names (a run killed before or right after its commit), version-1 companions of
    a (split, size) whose line is now version 2. A missing or stale plain alias is re-linked.
    """
    removed: list[str] = []
    names = sorted(os.listdir(directory))
    for name in names:
        m = _TEMP.match(name)
        if m and _ours(m["name"]) and not pid_alive(int(m["pid"])) and (directory / name).is_file():
            _remove(directory, name, removed)
    lines: dict[int, dict[str, dict[str, Any]] | None] = {}

    def committed(size: int) -> dict[str, dict[str, Any]] | None:
        if size not in lines:
            try:
                lines[size] = {str(r["split"]): r for r in read_metadata(directory, size)}
            except FormatError:
                lines[size] = None  # unreadable: do not guess what is committed
        return lines[size]

    for size in [int(n.split("_", 1)[0]) for n in names if _METADATA.match(n)]:
        for split, rec in (committed(size) or {}).items():
            build = _build_of(rec)
            if build is not None:  # first the alias (it may still link a file about to go)
                link_alias(directory, split, size, build)
    for name in names:
        m = BUILD_FILE.match(name) or LEGACY_FILE.match(name)
        if not m:
            continue
        recs = committed(int(m["size"]))
        if recs is None:
            continue
        build = _build_of(recs.get(m["split"]))
        if "build" in m.groupdict():
            if build != m["build"]:
                _remove(directory, name, removed)
        elif build is not None:  # a version-1 file of a split now at version 2
            _remove(directory, name, removed)
    return removed


def _build_of(rec: dict[str, Any] | None) -> str | None:
    if rec is None:
        return None
    try:
        return metadata_build(rec, "")
    except (FormatError, TypeError, ValueError):
        return None


def _remove(directory: Path, name: str, removed: list[str]) -> None:
    fault_point(f"pack.remove.before:{name}")
    (directory / name).unlink(missing_ok=True)
    removed.append(name)


def link_alias(directory: Path, split: str, size: int, build: str) -> None:
    """Make the plain `{S}_{N}.npy` the committed build's data file (hard link; symlink; else no alias)."""
    alias, target = directory / data_name(split, size), directory / data_name(split, size, build)
    if not target.is_file():
        return
    with contextlib.suppress(OSError):
        if alias.exists() and os.path.samefile(alias, target):
            return
    fault_point(f"pack.alias.before:{alias.name}")
    tmp = temp_sibling(alias)
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(target, tmp)
        except OSError:
            os.symlink(target.name, tmp)
        os.replace(tmp, alias)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        alias.unlink(missing_ok=True)  # never leave an alias of another build
        log.warning("cannot link %s to %s (%s); read the build's file named in the metadata", alias, target, exc)


def _check_space(directory: Path, need: int) -> None:
    free = shutil.disk_usage(directory).free
    if free < need + SPACE_MARGIN:
        raise StorageError(
            f"not enough free space for the packs: need {need / 2**20:.1f} MiB (+{SPACE_MARGIN >> 20} MiB margin), "
            f"{free / 2**20:.1f} MiB free, {directory}, free space or choose another --output"
        )


class PackSplitWriter:
    """Writes one (split, size) under hidden temp names; `commit` renames them to a new build and
    writes the metadata line LAST (the commit point). A context manager: any exception (Ctrl-C,
    SIGTERM, a full disk) removes the temps, and the previous build stays as it was.

    Holds the pack directory's lock from construction to commit/abort. The token (and loss)
    matrices are `.npy` memmaps, preallocated on disk before mapping, filled block by block.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        split: str,
        size: int,
        dtype: np.dtype,
        n_packs: int,
        with_loss: bool,
        *,
        n_segments: int = 0,
        with_pairs: bool = False,
        with_vision: bool = False,
    ) -> None:
        self.directory = prepare_pack_dir(directory)
        self.split, self.size, self.with_loss = split, int(size), with_loss
        self.with_pairs = with_pairs  # a preference split: seg_pair and seg_role too
        self.with_vision = with_vision  # a vision split: the image CSR too (`pack_checks.VISION_COMPANIONS`)
        self._temps: dict[str, Path] = {}
        self._created: list[Path] = []  # build files renamed into place but not yet committed
        self._build: str | None = None  # set just before the metadata line is written
        self._record: dict[str, Any] | None = None  # a `publish=False` commit's metadata line, not yet written
        self._done = False  # the metadata line names this build
        self.tokens: np.ndarray | None = None
        self.loss: np.ndarray | None = None
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(exclusive_output(self.directory))
        try:
            clean_pack_dir(self.directory)
            dtype = np.dtype(dtype).newbyteorder("<")
            itemsize = dtype.itemsize + (LOSS_DTYPE.itemsize if with_loss else 0)
            kinds = ALL_COMPANIONS if with_pairs else COMPANIONS
            companions = (n_packs + 1) * 8 + n_segments * sum(dt.itemsize for dt in kinds.values())
            _check_space(self.directory, n_packs * self.size * itemsize + companions + 1024 * 8)
            self.tokens = self._matrix(data_name(split, size), dtype, n_packs)
            self.loss = self._matrix(loss_name(split, size), LOSS_DTYPE, n_packs) if with_loss else None
        except BaseException:
            self.abort()
            raise

    def _temp(self, name: str) -> Path:
        tmp = temp_sibling(self.directory / name)
        self._temps[name] = tmp
        return tmp

    def _matrix(self, name: str, dtype: np.dtype, n_rows: int) -> np.ndarray:
        """A `[n_rows, size]` .npy memmap under a temp name, its blocks allocated; the caller fills EVERY row."""
        fault_point(f"pack.write.before:{name}")
        tmp = self._temp(name)
        try:
            if n_rows == 0:  # a zero-size memmap cannot be opened; write the empty .npy directly
                empty = np.zeros((0, self.size), dtype)
                with open(tmp, "wb") as fh:
                    np.lib.format.write_array(fh, empty, allow_pickle=False)
                return empty
            matrix = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(n_rows, self.size))
            # reserve every block now, so that writes through the map cannot fault (SIGBUS) on a full disk
            with open(tmp, "rb+") as fh, contextlib.suppress(AttributeError):  # AttributeError: no posix_fallocate
                os.posix_fallocate(fh.fileno(), 0, os.fstat(fh.fileno()).st_size)
            return matrix
        except OSError as exc:
            raise _write_error(tmp, exc) from exc

    def write_companion(self, what: str, values: np.ndarray) -> None:
        """Write one CSR companion (`pack_offsets`, `seg_lens`, ...) with its fixed dtype."""
        name = companion_name(self.split, self.size, what)
        fault_point(f"pack.write.before:{name}")
        if (what in PAIR_COMPANIONS and not self.with_pairs) or (what in VISION_COMPANIONS and not self.with_vision):
            raise FormatError(f"{what} belongs to a preference or vision split, {self.directory}, this is a bug")
        arr = np.ascontiguousarray(values, dtype=ALL_COMPANIONS[what])
        tmp = self._temp(name)
        try:
            with open(tmp, "wb") as fh:
                np.lib.format.write_array(fh, arr, allow_pickle=False)
        except OSError as exc:
            raise _write_error(tmp, exc) from exc

    def commit(self, metadata: dict[str, Any], salt: str | None = None, *, publish: bool = True) -> dict[str, Any]:
        """Fsync and hash the temps, rename them to the new build's names, then write its metadata line.

        `metadata` may set `format_version` (a mixture writes 3); a single-store pack is version 2.
        `salt` goes into the build id (`build_id`). `publish=False` stops before the metadata line:
        `publish_together` then commits several writers' splits in one metadata rewrite (until then an
        exception or an interruption removes this build's files, as before any commit).
        """
        for arr in (self.tokens, self.loss):
            if isinstance(arr, np.memmap):
                arr.flush()
        self.tokens = self.loss = None  # drop the maps before renaming
        plain = file_names(self.split, self.size, self.with_loss, None, self.with_pairs, self.with_vision)
        missing = [n for n in plain if n not in self._temps]
        if missing:
            self.abort()
            raise FormatError(f"pack writer did not write {', '.join(missing)}, {self.directory}, this is a bug")
        try:
            digests: dict[str, str] = {}
            for name in plain:
                with open(self._temps[name], "rb+") as fh:
                    os.fsync(fh.fileno())
                digests[name] = sha256_file(self._temps[name])
            build = build_id(digests, salt)
            final = file_names(self.split, self.size, self.with_loss, build, self.with_pairs, self.with_vision)
            files: dict[str, dict[str, Any]] = {}
            for name, target in zip(plain, final, strict=True):
                files[target] = {"bytes": self._temps[name].stat().st_size, "sha256": digests[name]}
                fault_point(f"pack.rename.before:{name}")
                path = self.directory / target
                existed = path.exists()  # same build id = same bytes: it is the committed file, keep it
                os.replace(self._temps.pop(name), path)
                if not existed:
                    self._created.append(path)
            fsync_dir(self.directory)
            record = {
                **metadata,
                "format": FORMAT_NAME,
                "format_version": int(metadata.get("format_version", SINGLE_SOURCE_VERSION)),
                "build": build,
                "files": files,
            }
            self._build = build
            if not publish:
                self._record = record
                return record
            fault_point(f"pack.metadata.before:{metadata_name(self.size)}")
            write_metadata_line(self.directory, record)  # THE commit point
        except OSError as exc:
            self.abort()
            raise _write_error(self.directory / metadata_name(self.size), exc) from exc
        self._published()
        return record

    def _published(self) -> None:
        """After the commit point: the build's files are the store; the previous build's files go."""
        self._created.clear()  # committed: these files are the store now
        self._done = True
        try:
            fsync_dir(self.directory)
        except OSError as exc:
            log.warning("packs committed, but syncing %s failed (%s)", self.directory, exc)
        try:
            fault_point(f"pack.metadata.after:{metadata_name(self.size)}")
            clean_pack_dir(self.directory)  # alias -> new build; the previous build's files go
        except OSError as exc:  # committed: the next run finishes the clean-up
            log.warning("packs committed, but cleaning %s failed (%s); the next pack run retries", self.directory, exc)
        finally:
            self._lock.close()

    def __enter__(self) -> PackSplitWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None or self._temps or not self._done:
            self.abort()  # failed, or left without commit: the committed build was never touched

    def abort(self) -> None:
        """Remove every temp file and release the lock; the committed build is never touched.

        Interrupted right after the commit, the new build is the store: finish its clean-up instead.
        """
        try:
            self.tokens = self.loss = None
            committed = self._committed()
            if committed:
                self._created.clear()
            for tmp in [*self._temps.values(), *self._created]:
                tmp.unlink(missing_ok=True)
            self._temps.clear()
            self._created.clear()
            if committed:
                with contextlib.suppress(OSError):
                    clean_pack_dir(self.directory)
        finally:
            self._lock.close()

    def _committed(self) -> bool:
        """Does the metadata line already name this writer's build (the commit happened)?"""
        if self._build is None:
            return False
        try:
            recs = read_metadata(self.directory, self.size)
        except (FormatError, OSError):
            return False
        return any(r.get("split") == self.split and r.get("build") == self._build for r in recs)


def publish_together(writers: list[PackSplitWriter], drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Commit writers that each ran `commit(..., publish=False)` (splits of one size, one directory) with ONE
    metadata rewrite: a run interrupted before it leaves every previous split as it was, after it every new
    one (never a new training split beside an old validation split). The lines of the `drop` splits go in
    the same rewrite; their build files and plain alias are removed after it."""
    records = []
    for w in writers:
        if w._record is None:
            raise FormatError(f"pack split {w.split}_{w.size} was not staged with commit(publish=False), this is a bug")
        records.append(w._record)
    directory = writers[0].directory
    try:
        fault_point(f"pack.metadata.before:{metadata_name(writers[0].size)}")
        write_metadata_line(directory, *records, drop=drop)  # THE commit point of every split
    except OSError as exc:
        for w in writers:
            w.abort()
        raise _write_error(directory / metadata_name(writers[0].size), exc) from exc
    for split in drop:  # its alias links the dropped build's data; clean_pack_dir removes the build's files
        with contextlib.suppress(OSError):
            (directory / data_name(split, writers[0].size)).unlink(missing_ok=True)
    for w in writers:
        w._published()
    return records


def _write_error(path: Path, exc: OSError) -> StorageError:
    return StorageError(write_error_message(exc, path) + " (the previous packs are intact)")
