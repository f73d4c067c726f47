"""`BlendPlan`: a blend's stores read from their metadata lines, its counts, store keys, fingerprint and
schedule (`index`, `locate`, `prefix_counts`), without the packs."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from packtool.core.blend.counts import parse_source, sample_counts
from packtool.core.blend.interleave import Interleave
from packtool.core.blend.keys import _GOLDEN, _mix, mix_rows, permute
from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_store import find_pack_dir, metadata_for, metadata_name, parse_data_name, sizes_in

_OPEN_THREADS = 8  # metadata lines read at once when a blend opens
DEFAULT_MAX_OPEN = 64
"""Stores whose memory maps stay open at once when the file-descriptor limit is unknown (each holds ~7)."""


def default_max_open() -> int:
    """Stores kept open by default: a sixteenth of this process's file-descriptor limit (7 per store, the
    rest left to the program), between 16 and 4,096; `DEFAULT_MAX_OPEN` where the limit cannot be read."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return DEFAULT_MAX_OPEN
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return 4096
    return max(16, min(4096, soft // 16))


_MAX_KEY = 2**63 - 1  # keys are int64


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _tokenizer_id(meta: dict[str, Any]) -> str | None:
    tok = meta.get("tokenizer")
    if isinstance(tok, dict):
        sha, name = tok.get("sha256"), tok.get("name")
        if sha:
            return f"sha256:{sha}"
        if name:
            return f"name:{name}"
    return None


class BlendPlan:
    """A seeded, exact, prefix-balanced blend of pack stores (module docstring), without the packs:
    counts, schedule (`index`, `locate`, `prefix_counts`), each store's metadata. Torch-free:
    `packtool.loader.BlendedDataset` adds the items, `packtool stats` reports it.

    sources: `[(store, weight), ...]` or `["STORE:W", ...]`; a store is what `PackedDataset` takes (a
        pack ROOT, a `packed/{tokenizer}` directory or a `{split}_{N}.npy` file).
    seed: the blend's seed (store orders, fractional subsets, interleave coins).
    split, size: the split and pack size of every store (size may be left out when the first store
        holds one size).
    max_open: how many stores keep their memory maps open at once (least recently used closed first);
        default `default_max_open()`: a sixteenth of the file-descriptor limit, 16 to 4,096.
    """

    def __init__(
        self,
        sources: Sequence[Any],
        seed: int = 0,
        split: str = "training",
        size: int | None = None,
        *,
        max_open: int | None = None,
    ) -> None:
        if isinstance(sources, Mapping) or not isinstance(sources, Sequence):  # {store: 2} lost its weights
            raise ConfigError(
                f"blend sources must be a list, got a {type(sources).__name__}, BlendedDataset, pass "
                "[(store, weight), ...] or ['STORE:W', ...] (a dict: list(d.items()))"
            )
        if isinstance(sources, (str, os.PathLike)) or not len(sources):
            raise ConfigError(
                "a blend needs a list of sources, BlendedDataset, pass [(store, weight), ...] or ['STORE:W', ...]"
            )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"blend seed must be an integer >= 0, got {seed!r}, BlendedDataset, pass e.g. seed=0")
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1):
            raise ConfigError(  # size=0 said: pack every store with --size 0
                f"blend size must be a positive integer (the stores' pack size), got {size!r}, BlendedDataset, "
                "pass the size the stores were packed at (size=4096) or leave it out when they hold one size"
            )
        if not isinstance(split, str) or not split:
            raise ConfigError(
                f"blend split must be a split name, got {split!r}, BlendedDataset, pass e.g. split='training'"
            )
        if max_open is not None and (
            isinstance(max_open, bool) or not isinstance(max_open, (int, np.integer)) or max_open < 1
        ):
            raise ConfigError(
                f"max_open must be an integer >= 1, got {max_open!r}, BlendedDataset, pass e.g. max_open=64 or leave it out"
            )
        self.seed, self.split = int(seed), str(split)
        self.max_open = default_max_open() if max_open is None else int(max_open)
        parsed = [parse_source(s) for s in sources]
        self.paths: list[str] = [p for p, _ in parsed]
        self.weights: list[float] = [w for _, w in parsed]
        first = self._read_store(0, parsed[0][0], size)
        size = first[1]
        with ThreadPoolExecutor(max_workers=_OPEN_THREADS) as pool:  # file-system latency overlaps (NFS, Lustre)
            rest = list(pool.map(lambda i: self._read_store(i, parsed[i][0], size), range(1, len(parsed))))
        tokenizer = first[3]
        dirs, builds, n_packs = [], [], []  # the metadata dicts are not kept: only their few numbers
        for i, (d, _, n, tok, build) in enumerate([first, *rest]):
            if tok != tokenizer:
                raise ConfigError(
                    f"blend stores must share one tokenizer: {self.paths[0]} has {tokenizer}, {self.paths[i]} has {tok}, BlendedDataset, blend stores of one tokenizer"
                )
            dirs.append(d)
            builds.append(build)
            n_packs.append(n)
        self.size = int(size)  # type: ignore[arg-type]
        self.tokenizer = tokenizer
        self.directories: list[Path] = dirs
        self.builds: list[str | None] = builds  # each store's build id (its file names), None: version-1 names
        self.n_packs = np.array(n_packs, np.int64)
        self.full_passes, self.partial, self.total = sample_counts(self.weights, n_packs, self.paths)
        self.counts = self.full_passes * self.n_packs + self.partial
        seen: dict[str, int] = {}
        digests, reps = [], []
        for d, build in zip(dirs, builds, strict=True):
            ident = str(build or d.resolve())
            rep = seen.get(ident, 0)
            seen[ident] = rep + 1
            digests.append(int(hashlib.sha256(ident.encode()).hexdigest()[:16], 16))
            reps.append(rep)
        self.store_keys = mix_rows([self.seed] * len(dirs), digests, reps)
        keys = self.store_keys.tolist()
        ident = "\n".join(f"{k:016x} {w!r} {n}" for k, w, n in zip(keys, self.weights, n_packs, strict=True))
        #: names the blend in sampler states: seed, split, size, stores (build ids), weights and pack counts
        self.fingerprint = hashlib.sha256(f"{self.seed} {self.split} {self.size}\n{ident}".encode()).hexdigest()[:16]
        self.interleave = Interleave(self.counts, self.seed)

    def __len__(self) -> int:
        return self.total

    def _read_store(self, i: int, path: str, size: int | None) -> tuple[Path, int, int, str | None, str | None]:
        """`(directory, size, n_packs, tokenizer id, build)` of source i, from its metadata line only."""
        p = Path(path)
        if not os.path.exists(path):
            raise ConfigError(f"blend store {path} does not exist, BlendedDataset, check the path (source {i})")
        file_size = None
        if p.is_file():
            named = parse_data_name(p.name)
            if named is None:
                raise ConfigError(
                    f"{p.name} is not a pack file named {{split}}_{{N}}.npy, {p}, pass the pack directory"
                )
            if named[0] != self.split:
                raise ConfigError(
                    f"{p.name} is split {named[0]} but the blend reads {self.split}, {p}, pass split={named[0]!r} or the {self.split} file"
                )
            file_size = named[1]
        try:  # fast path: a packed/{tokenizer} directory holding the blend's size (no directory scan)
            d = (
                p
                if size is not None and file_size is None and (p / metadata_name(int(size))).is_file()
                else find_pack_dir(p)
            )
        except FormatError as exc:
            raise ConfigError(
                f"blend store {path} is not a pack store ({exc}), BlendedDataset, pass a pack ROOT or packed/{{tokenizer}} directory"
            ) from None
        if size is None:
            if file_size is not None:
                size = file_size
            else:
                found = sizes_in(d)
                if len(found) != 1:
                    shown = ", ".join(map(str, found)) or "none"
                    raise ConfigError(f"pack store {d} holds sizes {shown}, BlendedDataset, pass size=N")
                size = found[0]
        if file_size is not None and file_size != size:
            raise ConfigError(
                f"blend stores have pack sizes {size} and {file_size}, {p}, blend stores packed at one size (or pass size=)"
            )
        if d is not p and not (d / metadata_name(int(size))).exists():
            shown = ", ".join(map(str, sizes_in(d))) or "none"
            raise ConfigError(
                f"blend stores must share one pack size: {d} holds sizes {shown}, not {size}, BlendedDataset, pass one of those as size= or pack every store with --size {size}"
            )
        try:
            meta = metadata_for(d, self.split, int(size))
        except FormatError as exc:
            raise ConfigError(f"{exc} (blend source {i})") from None
        n = meta.get("n_packs")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"metadata n_packs is {n!r}, {d}, re-run `packtool pack` (blend source {i})")
        if meta.get("preference") is not None:  # pair ids and prompt links are store-local: no batch mixes them yet
            raise ConfigError(
                f"blend store {path} is a preference pack store (pairs), BlendedDataset, blend plain pack stores "
                "only (preference stores: load each with PackedDataset)"
            )
        return d, int(size), n, _tokenizer_id(meta), meta.get("build")

    # -- the schedule -------------------------------------------------------------------
    def index(self, start: int, stop: int, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`(source, source_index)` of keys `range(start, stop)` (plus `epoch·len(self)` when given),
        as two int64 arrays; reads no pack."""
        for name, value in (("start", start), ("stop", stop), ("epoch", 0 if epoch is None else epoch)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ConfigError(
                    f"index {name} {value!r} is not an integer, BlendedDataset.index, pass integer start, stop (and epoch)"
                )
        start, stop = int(start), int(stop)
        if start < 0 or stop < start:
            raise ConfigError(
                f"index range {start}..{stop} is not a non-negative range, BlendedDataset.index, pass 0 <= start <= stop"
            )
        offset = 0 if epoch is None else int(epoch) * self.total
        if offset < 0 or stop + offset > _MAX_KEY:
            raise ConfigError(
                f"index range {start}..{stop} of epoch {epoch} is outside the keys 0 .. 2**63-1, BlendedDataset.index, "
                "pass an epoch >= 0 and keys below 2**63"
            )
        return self.locate(np.arange(start + offset, stop + offset, dtype=np.int64))

    def locate(self, keys: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """`(source, source_index)` of each key `epoch·T + t` (any order, any epochs)."""
        raw = np.asarray(keys)
        if raw.size and (
            raw.dtype.kind not in "iuO"
            or (raw.dtype.kind == "O" and not all(_is_int(k) for k in raw.reshape(-1).tolist()))
        ):  # [1.5] read key 1, [True] key 1
            shown = raw.reshape(-1)[:3].tolist()
            raise ConfigError(
                f"blend keys must be integers, got {shown!r}{' ...' if raw.size > 3 else ''} ({raw.dtype}), "
                "BlendedDataset, pass integer keys (epoch * len(ds) + t)"
            )
        try:
            if raw.dtype.kind == "u" and raw.size and int(raw.max()) > _MAX_KEY:  # 2**63 is a uint64: no overflow
                raise OverflowError
            keys = np.asarray(raw, np.int64).reshape(-1)
        except OverflowError:
            raise IndexError("a blend key is outside 0 .. 2**63-1") from None
        if keys.size and int(keys.min()) < 0:
            raise IndexError(f"blend key {int(keys.min())} is negative")
        src = np.empty(keys.size, np.int64)
        occ = np.empty(keys.size, np.int64)
        epochs = keys // self.total
        pos = keys - epochs * self.total
        uniq = np.unique(epochs).tolist()
        for e in uniq:
            sel: Any = slice(None) if len(uniq) == 1 else np.flatnonzero(epochs == e)
            src[sel], occ[sel] = self.interleave.locate(pos[sel], int(e))
        return src, self._packs(src, occ, epochs)

    def _packs(self, src: np.ndarray, occ: np.ndarray, epochs: np.ndarray) -> np.ndarray:
        n = self.n_packs[src]
        passes = occ // n
        within = occ - passes * n
        with np.errstate(over="ignore"):
            key = _mix(
                self.store_keys[src] ^ _mix(epochs.astype(np.uint64) * np.uint64(_GOLDEN) + passes.astype(np.uint64))
            )
        return permute(within, n, key)

    def packs_of(self, s: int, occurrences: np.ndarray, epoch: int = 0) -> np.ndarray:
        """The packs of store s at its `occurrences` (0 .. counts[s] - 1) in `epoch`."""
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s < self.n_packs.size:
            raise ConfigError(
                f"store {s!r} is not in 0..{self.n_packs.size - 1}, BlendPlan.packs_of, pass a source index"
            )
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"epoch {epoch!r} is not an integer >= 0, BlendPlan.packs_of, pass epoch >= 0")
        raw = np.asarray(occurrences)
        if raw.size and (raw.dtype.kind not in "iu" or raw.min() < 0 or raw.max() >= self.counts[s]):
            raise ConfigError(  # an occurrence past the partial pass gave a pack the blend never draws
                f"occurrences of store {s} must be integers in 0..{int(self.counts[s]) - 1}, BlendPlan.packs_of, "
                "pass occurrences below counts[s]"
            )
        occ = raw.astype(np.int64).reshape(-1)
        return self._packs(np.full(occ.size, s, np.int64), occ, np.full(occ.size, epoch, np.int64))

    def prefix_counts(self, t: int, epoch: int = 0) -> np.ndarray:
        """How many of the first `t` samples of `epoch` each store supplies (O(stores), closed form)."""
        return self.interleave.prefix_counts(t, epoch)
