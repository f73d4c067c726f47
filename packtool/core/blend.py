"""The torch-free half of a load-time blend of pack stores: counts, store orders, the interleave.

`packtool.loader.BlendedDataset` (items) and `packtool stats STORE:W ...` (the report) share it; the
loader's module docstring describes the order in full. Everything is computed on the fly from O(stores)
numbers, never from an array of samples.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from packtool.core.mixture import fractional_count
from packtool.errors import ConfigError, FormatError, UsageError
from packtool.formats.pack_store import find_pack_dir, metadata_for, metadata_name, parse_data_name, sizes_in

#: schedules at or beyond this many samples per epoch are refused (exact rounding needs T < 2**52)
MAX_SAMPLES = 2**52
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


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = 0x9E3779B97F4A7C15
_ROUNDS = 6
_MASK64 = (1 << 64) - 1


_MAX_KEY = 2**63 - 1  # keys are int64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def mix_int(*parts: int) -> int:
    """A 64-bit key from a few non-negative integers (Python ints, order-sensitive)."""
    h = np.zeros(1, np.uint64)
    for p in parts:
        with np.errstate(over="ignore"):
            h = _mix(h ^ np.uint64((int(p) * _GOLDEN + 1) & _MASK64))
    return int(h[0])


def mix_rows(*columns: list[int]) -> np.ndarray:
    """`mix_int(*row)` for every row of the columns at once (uint64 array)."""
    h = np.zeros(len(columns[0]), np.uint64)
    for col in columns:
        h = _mix(h ^ np.array([(int(p) * _GOLDEN + 1) & _MASK64 for p in col], np.uint64))
    return h


def permute(j: np.ndarray, n: np.ndarray | int, key: np.ndarray | int) -> np.ndarray:
    """`π_key(j)` for each `j` in `range(n)`: a seeded bijection of `range(n)`, evaluated pointwise.

    `n` and `key` may be per-element arrays. A balanced Feistel network of `_ROUNDS` rounds on `2h` bits
    (`2**(2h) >= n`, the smallest even bit count), cycle-walked: values that land at or beyond `n` are
    enciphered again until they fall inside (fewer than 4 rounds of walking on average).
    """
    j = np.asarray(j, np.int64)
    nn = np.broadcast_to(np.asarray(n, np.int64), j.shape)
    keys = np.broadcast_to(np.asarray(key, np.uint64), j.shape)
    if j.size and (np.any(j < 0) or np.any(j >= nn)):
        raise IndexError("permute: an index is outside range(n)")
    bits = np.ceil(np.log2(np.maximum(nn, 2).astype(np.float64))).astype(np.int64)
    half = ((bits + 1) // 2).astype(np.uint64)
    mask = (np.uint64(1) << half) - np.uint64(1)
    round_keys = [_mix(keys ^ np.uint64((r + 1) * _GOLDEN & _MASK64)) for r in range(_ROUNDS)]
    out = j.astype(np.uint64)
    todo = np.flatnonzero(nn > 1)
    while todo.size:
        x = out[todo]
        h, m = half[todo], mask[todo]
        left, right = x >> h, x & m
        for rk in round_keys:
            left, right = right, left ^ (_mix(right ^ rk[todo]) & m)
        x = (left << h) | right
        out[todo] = x
        todo = todo[x >= nn[todo].astype(np.uint64)]
    return out.astype(np.int64)


def _round_share(x: np.ndarray, a: np.ndarray, m: np.ndarray, u: np.ndarray | float = 0.5) -> np.ndarray:
    """`floor(x·a/m + u)` for int64 arrays with `0 <= x, a <= m < 2**52` and offsets `0 <= u < 1`.

    The quotient and remainder of `x·a / m` are exact (a float64 estimate, then the remainder in wrapping
    int64 arithmetic: its true value is a few `m` at most, so the wrap is harmless); only the comparison of
    the remainder's fraction `r/m` with `1 - u` is a float one (IEEE division: the same on every machine,
    and monotone in r, so the result is monotone in x with steps of 0 or 1, 0 at x = 0 and a at x = m)."""
    q = np.floor(x.astype(np.float64) * a.astype(np.float64) / m.astype(np.float64)).astype(np.int64)
    with np.errstate(over="ignore"):
        r = x * a - q * m
    d = r // m
    q += d
    r -= d * m
    return q + (r.astype(np.float64) / m.astype(np.float64) >= 1.0 - np.asarray(u, np.float64))


def parse_source(spec: Any) -> tuple[str, float]:
    """`(path, weight)` from `"STORE:W"`, `"STORE"` (weight 1) or a `(store, weight)` pair."""
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2:
            raise ConfigError(
                f"blend source {spec!r} is not a (store, weight) pair, BlendedDataset, pass [(store, weight), ...]"
            )
        path, weight = spec
        return str(os.fspath(path)), _check_weight(weight, str(path))
    if isinstance(spec, (str, os.PathLike)):
        text = str(os.fspath(spec))
        head, sep, tail = text.rpartition(":")
        if sep and head and not Path(text).exists():
            try:
                value = float(tail)
            except ValueError:
                value = None
            if value is not None:
                return head, _check_weight(value, head, tail)
        return text, 1.0
    raise ConfigError(f"blend source {spec!r} is not STORE:W or (store, weight), BlendedDataset, pass e.g. 'web:0.5'")


def _check_weight(weight: Any, where: str, text: str | None = None) -> float:
    shown = text if text is not None else repr(weight)
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating)):
        raise UsageError(
            f"blend weight {shown} of {where} is not a number, BlendedDataset, write STORE:2 (twice) or STORE:0.5 (a seeded half)"
        )
    w = float(weight)
    if not math.isfinite(w) or w <= 0:
        raise UsageError(
            f"blend weight {shown} of {where} must be a finite number > 0 (epochs of that store), BlendedDataset, "
            "write STORE:2 (twice), STORE:0.5 (a seeded half) or drop the store"
        )
    return w


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
        if isinstance(sources, (str, os.PathLike)) or not len(sources):
            raise ConfigError(
                "a blend needs a list of sources, BlendedDataset, pass [(store, weight), ...] or ['STORE:W', ...]"
            )
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"blend seed must be an integer >= 0, got {seed!r}, BlendedDataset, pass e.g. seed=0")
        self.seed, self.split = int(seed), str(split)
        self.max_open = default_max_open() if max_open is None else max(1, int(max_open))
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
        whole = {w: math.floor(Fraction(repr(w))) for w in set(self.weights)}  # core.mixture's exact rules
        passes = [whole[w] for w in self.weights]  # Python ints: a weight of 1e300 may not wrap
        partial = [fractional_count(w, n) if w != whole[w] else 0 for w, n in zip(self.weights, n_packs, strict=True)]
        total = sum(k * n + m for k, n, m in zip(passes, n_packs, partial, strict=True))
        if total == 0:
            raise ConfigError(
                "the blend has no samples (every store is empty or its weight rounds to 0 packs), BlendedDataset, raise a weight or add packs"
            )
        if total >= MAX_SAMPLES:
            raise ConfigError(
                f"the blend holds {total if total < 10**18 else f'{float(total):.3g}'} samples per epoch, over the exact limit 2**52, BlendedDataset, lower the weights"
            )
        self.full_passes = np.array([min(k, MAX_SAMPLES) for k in passes], np.int64)  # (an empty store's k)
        self.partial = np.array(partial, np.int64)
        self.counts = self.full_passes * self.n_packs + self.partial
        self.total = int(total)
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
                f"blend stores must share one pack size: {d} holds sizes {shown}, not {size}, BlendedDataset, pack every store with --size {size}"
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
        try:
            keys = np.asarray(keys, np.int64).reshape(-1)
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
        occ = np.asarray(occurrences, np.int64)
        return self._packs(np.full(occ.size, s, np.int64), occ, np.full(occ.size, epoch, np.int64))

    def prefix_counts(self, t: int, epoch: int = 0) -> np.ndarray:
        """How many of the first `t` samples of `epoch` each store supplies (O(stores), closed form)."""
        return self.interleave.prefix_counts(t, epoch)


class Interleave:
    """The blend's interleave over stores of `counts[s]` samples each (module docstring): a Huffman tree
    whose inner nodes split their run of samples between their children by rounding.

    `locate(t, epoch)` gives `(store, occurrence)` of positions t (O(depth) vectorised numpy steps);
    `prefix_counts(t, epoch)` every store's count among the first t (O(stores)). Stores of count 0 never
    appear. Memory: four int64 per store.
    """

    def __init__(self, counts: np.ndarray, seed: int = 0) -> None:
        self.counts = np.asarray(counts, np.int64)
        self.seed = int(seed)
        self.total = int(self.counts.sum())
        if self.total <= 0 or self.total >= MAX_SAMPLES or np.any(self.counts < 0):
            raise ConfigError(
                f"an interleave needs counts >= 0 summing to 1..2**52-1, got a sum of {self.total}, Interleave, pass positive counts"
            )
        self._build_tree()

    def _build_tree(self) -> None:
        s = int(self.counts.size)
        live = [(c, i, i) for i, c in enumerate(self.counts.tolist()) if c > 0]
        heapq.heapify(live)
        first, second, node_count = [], [], []
        nxt = s
        while len(live) > 1:
            ca, _, a = heapq.heappop(live)
            cb, _, b = heapq.heappop(live)
            first.append(a)
            second.append(b)
            node_count.append(ca + cb)
            heapq.heappush(live, (ca + cb, nxt, nxt))
            nxt += 1
        self._root = live[0][2]
        self._first = np.array(first, np.int64)
        self._second = np.array(second, np.int64)
        counts = np.concatenate([self.counts, np.array(node_count, np.int64)])
        self._node_count = counts
        # the prefix bound: |E_s| <= e·β with e the largest rounding error of a node, β = max over stores of
        # N_s·Σ 1/N_a over the nodes a on its path below the root (<= 1.68/0.5 for any Huffman tree); the
        # seeded offsets of each epoch stay within 1/2 ± δ so that e·β <= 1.96 < 2
        acc = np.zeros(counts.size, np.float64)
        for u in range(self._first.size - 1, -1, -1):  # parents were created after their children
            for child in (self._first[u], self._second[u]):
                acc[child] = acc[s + u] + 1.0 / counts[child]
        beta = float(np.max(self.counts * acc[:s])) if s else 0.0
        self.beta = beta
        self.delta = min(0.45, max(0.0, 1.96 / beta - 0.5)) if beta > 0 else 0.45
        self._epoch_cache: tuple[int, np.ndarray, np.ndarray] | None = None
        self._table_cache: tuple[int, tuple[np.ndarray, ...]] | None = None
        depth = np.zeros(counts.size, np.int64)
        for u in range(self._first.size - 1, -1, -1):  # parents were created after their children
            depth[self._first[u]] = depth[self._second[u]] = depth[s + u] + 1
        self._depth = int(depth.max()) if depth.size else 0

    def _draw(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Per inner node for `epoch`: which child comes first (a coin) and its rounding offset u."""
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            base = np.uint64(mix_int(self.seed, 0x5EED, epoch))
            bits = _mix(np.arange(self._first.size, dtype=np.uint64) ^ base)
            coins = (bits & np.uint64(1)).astype(bool)
            unit = (bits >> np.uint64(11)).astype(np.float64) / float(1 << 53)  # [0, 1)
            offsets = 0.5 + self.delta * (2.0 * unit - 1.0)
            self._epoch_cache = (epoch, coins, offsets)
        return self._epoch_cache[1], self._epoch_cache[2]

    def _tables(self, epoch: int) -> tuple[np.ndarray, ...]:
        """Per node (leaves too) for `epoch`: first child, second child, first child's count, own count,
        offset. A leaf is its own first child with a = m, so a walk that reached it stays there."""
        if self._table_cache is None or self._table_cache[0] != epoch:
            s = int(self.counts.size)
            swap, offset = self._draw(epoch)
            nodes = np.arange(self._node_count.size, dtype=np.int64)
            first, second = nodes.copy(), nodes.copy()
            first[s:] = np.where(swap, self._second, self._first)
            second[s:] = np.where(swap, self._first, self._second)
            m = np.maximum(self._node_count, 1)
            a = m.copy()
            a[s:] = self._node_count[first[s:]]
            off = np.full(nodes.size, 0.5)
            off[s:] = offset
            self._table_cache = (epoch, (first, second, a, m, 1.0 - off))
        return self._table_cache[1]

    def locate(self, t: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """`(store, occurrence)` of positions `t` of `epoch`: a walk from the root, all positions at once."""
        first, second, a_of, m_of, edge_of = self._tables(epoch)
        node = np.full(t.size, self._root, np.int64)
        x = np.asarray(t, np.int64).copy()
        exact = int(self._node_count.max()) < 2**31  # x·a < 2**62: plain int64 arithmetic
        for _ in range(self._depth):
            a, m, edge = a_of[node], m_of[node], edge_of[node]
            if exact:
                prod = x * a
                q = prod // m
                r = prod - q * m
            else:
                q = np.floor(x.astype(np.float64) * a.astype(np.float64) / m.astype(np.float64)).astype(np.int64)
                with np.errstate(over="ignore"):
                    r = x * a - q * m
                d = r // m
                q += d
                r -= d * m
            mf = m.astype(np.float64)
            lo = q + (r.astype(np.float64) / mf >= edge)  # floor(x·a/m + u): samples of the first child
            r += a  # the same for x + 1, from x's quotient and remainder
            carry = r >= m
            r -= carry * m
            hi = q + carry + (r.astype(np.float64) / mf >= edge)
            is_first = hi > lo
            x = np.where(is_first, lo, x - lo)
            node = np.where(is_first, first[node], second[node])
        return node, x

    def prefix_counts(self, t: int, epoch: int = 0) -> np.ndarray:
        """How many of the first `t` samples of `epoch` each store supplies (O(stores), closed form)."""
        t = int(t)
        if not 0 <= t <= self.total:
            raise ConfigError(f"prefix {t} is outside 0..{self.total}, Interleave.prefix_counts, pass 0 <= t <= total")
        s = int(self.counts.size)
        out = np.zeros(self._node_count.size, np.int64)
        out[self._root] = t
        swap, offset = self._draw(epoch)
        for u in range(self._first.size - 1, -1, -1):  # parents were created after their children
            node = s + u
            f, g = (self._second[u], self._first[u]) if swap[u] else (self._first[u], self._second[u])
            x = np.array([out[node]], np.int64)
            lo = int(_round_share(x, self._node_count[[f]], self._node_count[[node]], offset[u])[0])
            out[f], out[g] = lo, out[node] - lo
        return out[:s]
