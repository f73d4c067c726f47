"""The blend's interleave: a Huffman tree over the stores' counts whose inner nodes split their run of samples
between their children by rounding (`packtool.loader.blend`'s docstring gives the prefix bound)."""

from __future__ import annotations

import heapq

import numpy as np

from packtool.core.blend.keys import _mix, mix_int
from packtool.errors import ConfigError

#: schedules at or beyond this many samples per epoch are refused (exact rounding needs T < 2**52)
MAX_SAMPLES = 2**52


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


class Interleave:
    """The blend's interleave over stores of `counts[s]` samples each (module docstring): a Huffman tree
    whose inner nodes split their run of samples between their children by rounding.

    `locate(t, epoch)` gives `(store, occurrence)` of positions t (O(depth) vectorised numpy steps);
    `prefix_counts(t, epoch)` every store's count among the first t (O(stores)). Stores of count 0 never
    appear. Memory: four int64 per store.
    """

    def __init__(self, counts: np.ndarray, seed: int = 0) -> None:
        raw = np.asarray(counts)
        if raw.size and raw.dtype.kind not in "iu":  # counts of 1.5 were truncated
            raise ConfigError(f"interleave counts must be integers, got {raw.dtype}, Interleave, pass integer counts")
        self.counts = raw.astype(np.int64).reshape(-1)
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
        for name, value in (("prefix", t), ("epoch", epoch)):  # 1.5 read 1, epoch -1 drew a coin of its own
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ConfigError(
                    f"{name} {value!r} is not an integer >= 0, Interleave.prefix_counts, pass 0 <= t <= total, epoch >= 0"
                )
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
