"""A `PackedSampler`'s layout and its global order: the plain order (numpy, a lazy Feistel permutation or a
blend's own schedule) and the balanced one, in windows of steps, with the head window an elastic resume
mid-window starts with.

A layout is a world size, a `base` (the global position of the epoch where it began), the indices each
rank `consumed` after it, and a `head` (the layout whose interrupted window this one starts with). Its
global sequence is its head positions R (sorted plain positions, all < n), then the plain positions base,
base + 1, ... (padded by wrap-around or cut to a multiple of W, as always). The head window is its first
H0 = ceil(|R| / (W·B))·W·B entries (R and the next few plain positions), balanced as one window of
H0 / (W·B) steps; the regular windows of K steps follow from plain position `rb`.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from packtool.core.balance import balanced_order
from packtool.core.blend import mix_int, permute
from packtool.core.cost import CostModel
from packtool.loader.sampler_costs import costs_of, sum_costs

if TYPE_CHECKING:
    from packtool.loader.blend import BlendedDataset

_HEAD_TAG = (1 << 40) - 1  # the head window's plan seed is (epoch << 40) | _HEAD_TAG: never a regular window's index
_NONE = np.zeros(0, np.int64)
_NO_COST = np.zeros(0, np.float64)


class WindowedLayout:
    """The layout fields of a `PackedSampler` and the global order they give (module docstring)."""

    blend: BlendedDataset | None
    n: int
    num_replicas: int
    rank: int
    shuffle: bool
    seed: int
    drop_last: bool
    order_kind: str
    lazy: bool
    epoch: int
    base: int
    consumed: int
    balance: CostModel | None
    micro_batches: int
    window: int
    costs: np.ndarray | None
    _table: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None
    _cache: tuple[tuple[int, int], np.ndarray] | None
    _perm: tuple[int, np.ndarray] | None
    head: dict[str, Any] | None
    pre: int | None
    _head_cache: tuple[int, np.ndarray, np.ndarray] | None

    # -- the global order -------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Indices of this rank in the current epoch (after `base`; `consumed` of them are done)."""
        return self._count(self._head(self.epoch).size)

    def _count(self, h: int) -> int:
        remaining = h + max(0, self.n - self.base)
        return remaining // self.num_replicas if self.drop_last else -(-remaining // self.num_replicas)

    # -- elastic resume mid-window: the layout starts with the rest of an interrupted window ----------
    # The global sequence of a layout is its head positions R (sorted plain positions, all < n), then the plain
    # positions base, base + 1, ... (padded by wrap-around or cut to a multiple of W, as always). The head
    # window is its first H0 = ceil(|R| / (W·B))·W·B entries (R and the next few plain positions), balanced as
    # one window of H0 / (W·B) steps; the regular windows of K steps follow from plain position `rb`.
    def _head(self, epoch: int) -> np.ndarray:
        """The head positions R of `epoch` (empty without a head), recomputed from `self.head` once per epoch."""
        return self._head_priced(epoch)[0]

    def _head_priced(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """`(R, costs of R)`: a resume prices the interrupted window once and reuses its costs here."""
        if self.head is None:
            return _NONE, _NO_COST
        if self._head_cache is None or self._head_cache[0] != epoch:
            rest, costs, _ = self._layout(self.head)._cut(epoch)
            self._head_cache = (epoch, rest, costs)
        return self._head_cache[1], self._head_cache[2]

    def _layout(self, state: dict[str, Any]) -> Self:
        """This sampler at the layout `state` describes (world size, base, consumed, head), as rank 0."""
        s = copy.copy(self)
        s.num_replicas, s.rank = int(state["num_replicas"]), 0
        s.base, s.consumed, s.head = int(state["base"]), int(state["consumed"]), state.get("head")
        s._cache = s._head_cache = None
        return s

    def _span(self, epoch: int) -> tuple[int, int, int, int]:
        """`(h, h0, rb, total)`: head positions, head-window length (global indices `[0, h0)`), the plain
        position where the regular windows start, and the layout's global length."""
        h = self._head(epoch).size
        total = self._count(h) * self.num_replicas
        if h == 0:
            return 0, 0, self.base, total
        step = self.num_replicas * self.micro_batches
        h0 = min(total, -(-h // step) * step)
        return h, h0, self.base + max(0, h0 - h), total

    def _head_window(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The head window's plain positions in balanced order, and their costs."""
        h, h0, _, _ = self._span(epoch)
        head, head_costs = self._head_priced(epoch)
        fill = self.base + np.arange(max(0, h0 - h), dtype=np.int64)
        pos = np.concatenate([head[:h0], fill])
        costs = np.concatenate([head_costs[:h0], self._pack_costs(self._values(epoch, fill))])
        plan = balanced_order(
            np.arange(pos.size, dtype=np.int64),
            costs,
            world=self.num_replicas,
            micro_batches=self.micro_batches,
            window=max(1, -(-h0 // (self.num_replicas * self.micro_batches))),
            seed=self.seed,
            epoch=(epoch << 40) | _HEAD_TAG,
        )
        return pos[plan], costs[plan]

    def _regular(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """All regular windows' plain positions in balanced order, and their costs (stored path: one plan)."""
        assert self.costs is not None
        _, h0, rb, total = self._span(epoch)
        pos = rb + np.arange(total - h0, dtype=np.int64)
        costs = self.costs[self._values(epoch, pos)]
        plan = balanced_order(
            np.arange(pos.size, dtype=np.int64),
            costs,
            world=self.num_replicas,
            micro_batches=self.micro_batches,
            window=self.window,
            seed=self.seed,
            epoch=epoch,
        )
        return pos[plan], costs[plan]

    def _cut(self, epoch: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Where this layout stops after `consumed` indices per rank: the plain positions of the interrupted
        window not consumed yet (real ones, sorted), their costs, and the plain position where that window ends."""
        w, c = self.num_replicas, self.consumed
        h, h0, rb, total = self._span(epoch)
        hp = h0 // w
        if c < hp:
            (plan, costs), o, z = self._head_window(epoch), c, h0
        else:
            per = self.window * self.micro_batches
            j, o = divmod(c - hp, per)
            if o == 0:  # a window boundary: nothing of window j was consumed
                return _NONE, _NO_COST, self.base + max(0, min(h0 + j * per * w, total) - h)
            z = min(h0 + (j + 1) * per * w, total)
            if self.lazy:
                plan, costs = self._window_positions(epoch, j)
            else:
                plan, costs = (x[j * per * w : (j + 1) * per * w] for x in self._regular(epoch))
        rest, costs = plan[o * w :], costs[o * w :]
        real = rest < self.n
        by_pos = np.argsort(rest[real], kind="stable")
        return rest[real][by_pos], costs[real][by_pos], self.base + max(0, z - h)

    def _values(self, epoch: int, pos: np.ndarray) -> np.ndarray:
        """What the sampler yields at global positions `pos` of `epoch` (positions past n wrap: padding)."""
        p = np.asarray(pos, np.int64) % self.n
        if self.order_kind == "blend":
            return epoch * self.n + p
        if self.order_kind == "feistel-v1":
            return permute(p, self.n, mix_int(self.seed, epoch, 0xFE15))
        if not self.shuffle:
            return p
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n))
        return self._perm[1][p]

    def _pack_costs(self, values: np.ndarray) -> np.ndarray:
        assert self.balance is not None
        if self.costs is not None:
            return self.costs[values]
        if self.blend is not None:
            src, packs = self.blend.locate(values)
            out = np.empty(values.size, np.float64)
            for s in np.unique(src).tolist():
                sel = np.flatnonzero(src == s)
                out[sel] = sum_costs(self.balance, *self.blend.segment_lengths(s, packs[sel]), None)  # no pairs
            return out
        assert self._table is not None
        return costs_of(self.balance, *self._table, values)

    def _window(self, epoch: int, j: int) -> np.ndarray:
        """Balanced regular window j (lazy path): its global order, every rank's indices interleaved."""
        return self._values(epoch, self._window_positions(epoch, j)[0])

    def _window_positions(self, epoch: int, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Regular window j's plain positions in balanced order, and their costs (lazy path)."""
        m = self.window * self.num_replicas * self.micro_batches
        _, h0, rb, total = self._span(epoch)
        pos = rb + np.arange(j * m, min((j + 1) * m, total - h0), dtype=np.int64)
        costs = self._pack_costs(self._values(epoch, pos))
        plan = balanced_order(
            np.arange(pos.size, dtype=np.int64),
            costs,
            world=self.num_replicas,
            micro_batches=self.micro_batches,
            window=self.window,
            seed=self.seed,
            epoch=(epoch << 40) | j,
        )
        return pos[plan], costs[plan]

    @property
    def global_sample(self) -> int:
        """Samples of this epoch consumed over all ranks (where an elastic resume continues)."""
        return (self.base if self.pre is None else self.pre) + self.consumed * self.num_replicas
