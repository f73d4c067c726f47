"""A distributed, resumable sampler over packs, and the loader wrapper that makes resume exact.

Why a wrapper: a `DataLoader` pulls indices from its sampler ahead of the training loop
(`num_workers * prefetch_factor` batches), so a sampler cannot know what the loop actually
consumed. `ResumableLoader` counts the batches it hands to the loop and tells the sampler;
its `state_dict()` therefore describes consumed batches only, whatever `num_workers` and
prefetching were, and a loader restored from it yields exactly the batches an uninterrupted
run would have yielded next::

    sampler = PackedSampler(ds, num_replicas=world, rank=rank, seed=0)
    loader = ResumableLoader(DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2,
                                        collate_fn=PackedCollator()))
    loader.load_state_dict(ckpt["data"])          # optional: resume mid-epoch
    for batch in loader:                          # one epoch; call again for the next
        step(batch)
        ckpt["data"] = loader.state_dict()        # counts this batch as consumed

Without the wrapper, call `sampler.advance(batch_size)` after each batch yourself.

Balanced steps: `PackedSampler(ds, ..., balance=CostModel.from_config("config.json"), micro_batches=B)`
deals each global step's W·B packs so that the ranks' costs (`packtool.core.cost`) are as equal as a
window of `window` steps allows, reordering only inside those windows (`packtool.core.balance`);
each rank computes the same plan alone. `balance=None` is the plain sampler, index for index.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch

from packtool.core.balance import DEFAULT_WINDOW, balanced_order, check_balance
from packtool.core.blend import mix_int, permute
from packtool.core.cost import CostModel
from packtool.errors import ConfigError
from packtool.formats.pack_store import attended_prefix, open_pack_split
from packtool.loader.blend import BlendedDataset
from packtool.loader.dataset import PackedDataset
from packtool.loader.dynamic import DynamicBatchSampler

STATE_VERSION = 1
HEAD_STATE_VERSION = 2
"""A state whose layout starts with the rest of an interrupted window (`head`: a balanced elastic resume mid-window)
is written as version 2, so a packtool that cannot rebuild that window refuses it rather than skipping packs."""
_HEAD_TAG = (1 << 40) - 1  # the head window's plan seed is (epoch << 40) | _HEAD_TAG: never a regular window's index
_NONE = np.zeros(0, np.int64)
_NO_COST = np.zeros(0, np.float64)


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


LAZY_ABOVE = 1 << 26
"""Plain datasets with more packs than this are shuffled by an on-the-fly seeded permutation (`blend.permute`)
instead of `numpy`'s stored one (512 MiB of int64 at this size); the state names which (`order`)."""
_CHUNK = 1 << 14  # indices computed per step of a lazy iteration


class PackedSampler(torch.utils.data.Sampler[int]):
    """Shards packs across ranks with a seeded per-epoch shuffle, and resumes mid-epoch, at any world size.

    Like `DistributedSampler`: every rank draws the same permutation of `seed` and `epoch`,
    pads it (or with `drop_last`, cuts it) to a multiple of `num_replicas`, and takes every
    `num_replicas`-th index from `rank`. Unlike it, it remembers how many of this epoch's
    indices were consumed (`advance`) and starts after them on the next `__iter__`.

    data: a `PackedDataset`, a `BlendedDataset`, anything sized, or a count. Over a `BlendedDataset`
        the global order is the blend's own schedule (its seed, its interleave: `shuffle` is not
        applied on top, which would break the blend's prefix bound) and the sampler yields the blend's
        keys `epoch * len(blend) + position`, so DataLoader workers need no epoch sync. Over a blend, or
        a plain dataset of more than `LAZY_ABOVE` packs, nothing per sample is stored: the indices are
        computed chunk by chunk as the iteration goes (memory grows with the stores, not the samples).
    Elastic resume: a state taken at world size W loads into a sampler of another world size W' and
        continues from the same global sample (`base + consumed * W`) of the same epoch: 4 ranks that
        consumed 37 indices each continue, at 2 ranks, at global sample 148.

    balance: a `CostModel` (or a `(per_token, per_token_sq)` pair); each global step's `num_replicas * micro_batches` packs are then dealt
        so that the ranks' costs are as equal as possible, moving packs only inside windows of
        `window` consecutive steps of the plain order (`packtool.core.balance`). Needs a
        `PackedDataset` or `BlendedDataset` (its segment lengths price the packs). None: the plain order,
        unchanged. A balanced state moves to another world size at any step: mid-window, the packs of the
        interrupted window not yet consumed (recomputed from the state) are re-dealt, balanced, over the new ranks
        as the first window (the head), then the following windows come as the new world size deals them.
    micro_batches: packs each rank consumes per optimizer step (DataLoader `batch_size` x gradient
        accumulation steps): rank r's step t is its indices `[t * B, (t + 1) * B)`.
    window: steps per balancing window; a pack moves at most `window - 1` steps.
    """

    def __init__(
        self,
        data: Sized | int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        balance: CostModel | tuple[float, float] | None = None,
        micro_batches: int = 1,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        world, me = _world()
        self.blend: BlendedDataset | None = data if isinstance(data, BlendedDataset) else None
        self.n = int(data) if isinstance(data, int) else len(data)
        self.num_replicas = world if num_replicas is None else int(num_replicas)
        self.rank = me if rank is None else int(rank)
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ConfigError(
                f"rank {self.rank} is not in 0..{self.num_replicas - 1}, PackedSampler, pass 0 <= rank < num_replicas"
            )
        if self.n == 0:
            raise ConfigError("the dataset has no packs, PackedSampler, pack a non-empty split")
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        if drop_last and self.n < self.num_replicas:
            raise ConfigError(
                f"{self.n} packs cannot feed {self.num_replicas} ranks with drop_last=True, PackedSampler, use drop_last=False"
            )
        if self.blend is not None:
            self.order_kind = "blend"
        else:
            self.order_kind = "feistel-v1" if shuffle and self.n > LAZY_ABOVE else "numpy"
        self.lazy = self.order_kind != "numpy"
        self.epoch = 0
        self.base = 0  # global position of this epoch where the current rank layout began (elastic resume)
        self.consumed = 0  # indices of this epoch already consumed by the training loop (this rank), after base
        check_balance(self.num_replicas, micro_batches, window)
        self.balance = None if balance is None else CostModel.coerce(balance, "PackedSampler")
        self.micro_batches, self.window = int(micro_batches), int(window)
        self.costs: np.ndarray | None = None
        self._table: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None
        if self.balance is not None and self.blend is None:
            if self.lazy:
                self._table = _segments(data, self.n)  # memory maps: priced window by window
            else:
                # a shared-prompt completion also attends its prompt: priced as prompt + completion
                self.costs = self.balance.packs(*_segments(data, self.n))
        self._cache: tuple[tuple[int, int], np.ndarray] | None = None
        self._perm: tuple[int, np.ndarray] | None = None
        self.head: dict[str, Any] | None = None  # the layout whose interrupted window this one starts with
        self.pre: int | None = None  # samples consumed before this layout began (None: `base`)
        self._head_cache: tuple[int, np.ndarray, np.ndarray] | None = None

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

    def _layout(self, state: dict[str, Any]) -> PackedSampler:
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
                out[sel] = _sum_costs(self.balance, *self.blend.segment_lengths(s, packs[sel]), None)  # no pairs
            return out
        assert self._table is not None
        return _costs_of(self.balance, *self._table, values)

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

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The global order of `epoch` over all ranks (rank r's share is `order[r::num_replicas]`), from `base`.

        Materialises the whole epoch: for a blend or a huge dataset, iterate instead."""
        e = self.epoch if epoch is None else int(epoch)
        if self._cache is not None and self._cache[0] == (e, self.base):
            return self._cache[1]
        total = self.num_samples * self.num_replicas
        if self.balance is not None:
            _, h0, _, total = self._span(e)
            parts = [self._values(e, self._head_window(e)[0])] if h0 else []
            if self.lazy:
                m = self.window * self.num_replicas * self.micro_batches
                parts += [self._window(e, j) for j in range(-(-(total - h0) // m))]
            else:
                parts.append(self._values(e, self._regular(e)[0]))
            order = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        else:
            order = self._values(e, self.base + np.arange(total, dtype=np.int64))
        order.flags.writeable = False  # cached: shared by every call for this epoch
        self._cache = ((e, self.base), order)
        return order

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's full index list for `epoch` (default: the current one)."""
        if not self.lazy:
            return self.order(epoch)[self.rank :: self.num_replicas].copy()
        e = self.epoch if epoch is None else int(epoch)
        parts = list(self._chunks(e, 0))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _chunks(self, epoch: int, start: int) -> Iterator[np.ndarray]:
        """This rank's indices `[start, num_samples)` of `epoch`, a chunk at a time (lazy path)."""
        w, r, total = self.num_replicas, self.rank, self.num_samples
        if self.balance is None:
            for k in range(start, total, _CHUNK):
                ks = np.arange(k, min(k + _CHUNK, total), dtype=np.int64)
                yield self._values(epoch, self.base + r + ks * w)
            return
        _, h0, _, _ = self._span(epoch)
        hp = h0 // w  # this rank's indices in the head window
        if start < hp:
            yield self._values(epoch, self._head_window(epoch)[0][r::w][start:])
        start, total = max(0, start - hp), total - hp
        per = self.window * self.micro_batches  # this rank's indices per window
        for j in range(start // per, -(-total // per)):
            mine = self._window(epoch, j)[r::w]
            yield mine[max(0, start - j * per) :]

    def __iter__(self) -> Iterator[int]:
        start = self.consumed  # read NOW: DataLoader creates this iterator before any advance
        if not self.lazy:
            return iter(self.indices()[start:].tolist())
        return (int(v) for chunk in self._chunks(self.epoch, start) for v in chunk.tolist())

    def __len__(self) -> int:
        return self.num_samples - self.consumed

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle of `epoch`; a NEW epoch starts from its first index.

        Setting the epoch it already has keeps the consumed count, so the usual
        `sampler.set_epoch(epoch)` at the top of a resumed epoch does not lose the resume point.
        """
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.consumed = 0
            self.base = 0
            self.head, self.pre, self._head_cache = None, None, None

    def advance(self, n: int) -> None:
        """Record that the training loop consumed `n` more indices of this epoch."""
        self.consumed = min(self.num_samples, self.consumed + int(n))

    @property
    def exhausted(self) -> bool:
        return self.consumed >= self.num_samples

    @property
    def global_sample(self) -> int:
        """Samples of this epoch consumed over all ranks (where an elastic resume continues)."""
        return (self.base if self.pre is None else self.pre) + self.consumed * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        state = {
            "version": STATE_VERSION if self.head is None else HEAD_STATE_VERSION,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "base": self.base,
            "global_sample": self.global_sample,
            "seed": self.seed,
            "n": self.n,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "order": self.order_kind,
            "blend": None if self.blend is None else self.blend.fingerprint,
            "balance": None if self.balance is None else self.balance.to_dict(),
            "micro_batches": self.micro_batches,
            "window": self.window,
        }
        if self.head is not None:  # O(resumes in a row mid-head-window): a few ints each, never positions
            state["head"] = copy.deepcopy(self.head)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state`: at the same world size exactly where it was, at another from the same global
        sample; refuses a state taken with another dataset or blend, seed, order or balancing."""
        if state.get("version") not in (STATE_VERSION, HEAD_STATE_VERSION):
            raise ConfigError(
                f"sampler state version {state.get('version')!r} is not {STATE_VERSION} or {HEAD_STATE_VERSION}, PackedSampler.load_state_dict, use a checkpoint from this packtool"
            )
        mine = self.state_dict()
        theirs_blend = state.get("blend")
        if theirs_blend != mine["blend"]:
            what = f"blend {theirs_blend}" if theirs_blend else "a plain dataset"
            here = f"blend {mine['blend']}" if mine["blend"] else "a plain dataset"
            raise ConfigError(
                f"sampler state is of {what} but this sampler reads {here}, PackedSampler.load_state_dict, resume with the same stores, weights, seed, split and size"
            )
        keys = ["n", "seed", "shuffle", "drop_last", "order", "balance"]
        if self.balance is not None:  # the plan depends on these only when balancing
            keys += ["micro_batches", "window"]
        defaults = {"order": "numpy"}  # a state from before lazy orders
        for key in keys:
            theirs = state.get(key, defaults.get(key))  # a state from before balancing has no `balance` (None: plain)
            if theirs != mine[key]:
                raise ConfigError(
                    f"sampler state has {key}={theirs!r} but this sampler has {mine[key]!r}, PackedSampler.load_state_dict, resume with the same dataset, seed and balancing"
                )
        fields = {k: state.get(k, 0 if k == "base" else None) for k in ("num_replicas", "consumed", "base", "epoch")}
        for key, value in fields.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (key == "num_replicas"):
                raise ConfigError(
                    f"sampler state has {key}={value!r}, not an integer >= {int(key == 'num_replicas')}, "
                    "PackedSampler.load_state_dict, pass a state_dict() this packtool wrote"
                )
        world, consumed, base = int(state["num_replicas"]), int(state["consumed"]), int(state.get("base", 0))
        epoch, head = int(state["epoch"]), state.get("head")
        _check_head(head, self.balance is not None)
        pre = None if head is None else int(state["global_sample"]) - consumed * world
        known = None
        if head is not None:  # the interrupted window, recomputed here, must be the one the state was taken in
            known = self._layout(head)._cut(epoch)[:2]
            if self._digest(*known) != head.get("digest"):
                raise ConfigError(
                    "sampler state's interrupted window holds other packs or costs here, PackedSampler.load_state_dict, "
                    "resume with the same dataset, cost model and packtool version"
                )
        if world == self.num_replicas or consumed == 0:  # where it was (consumed 0: its head re-dealt at this size)
            pass
        elif self.balance is None:  # elastic: the same global sample, dealt to the new ranks
            base, consumed = base + consumed * world, 0
        else:  # elastic mid-window: the interrupted window's packs not consumed yet become this layout's head
            prev = self._layout({"num_replicas": world, "base": base, "consumed": consumed, "head": head})
            prev.epoch = epoch
            prev._head_cache = None if known is None else (epoch, *known)  # rebuilt once, above
            rest, rest_costs, end = prev._cut(epoch)
            _, h0, rb, _ = prev._span(epoch)
            hp = h0 // world
            if rest.size == 0:  # a window boundary: exactly the plain elastic resume
                head = None
            elif consumed < hp:  # inside the head window: that window depends on the head before it
                head = {"num_replicas": world, "base": base, "consumed": consumed, "head": head}
            else:  # inside a regular window: it depends on where the regular windows start, nothing before
                head = {"num_replicas": world, "base": rb, "consumed": consumed - hp, "head": None}
            if head is not None:
                head["digest"] = self._digest(rest, rest_costs)
            taken = int(state.get("global_sample", base + consumed * world))  # all layouts before, with this one
            pre, known = (None, None) if head is None else (taken, (rest, rest_costs))
            base, consumed = end, 0
        self.epoch, self.base, self.consumed, self.head, self.pre = epoch, base, consumed, head, pre
        self._cache = None
        self._head_cache = None if known is None else (epoch, *known)

    def _digest(self, positions: np.ndarray, costs: np.ndarray) -> str:
        """A fingerprint of head positions and their pack costs: a state's head is rebuilt from a few ints, and
        this proves the rebuild found the same packs (same dataset, cost model and plan; a blend's identity is
        its fingerprint, checked before)."""
        h = hashlib.blake2b(np.ascontiguousarray(positions, np.int64).tobytes(), digest_size=8)
        h.update(np.ascontiguousarray(costs, np.float64).tobytes())
        return h.hexdigest()


def _check_head(head: Any, balanced: bool) -> None:
    """Refuse a `head` (an interrupted layout: world size, base, consumed, its own head) that is not one."""
    while head is not None:
        ok = balanced and isinstance(head, dict) and set(head) <= {"num_replicas", "base", "consumed", "head", "digest"}
        ok = ok and all(
            isinstance(head.get(k), int) and not isinstance(head.get(k), bool) and head[k] >= (k == "num_replicas")
            for k in ("num_replicas", "base", "consumed")
        )
        if not ok:
            raise ConfigError(
                f"sampler state has a malformed head {head!r}, PackedSampler.load_state_dict, resume from the state the sampler wrote"
            )
        head = head.get("head")


def _costs_of(
    model: CostModel, pack_offsets: np.ndarray, seg_lens: np.ndarray, prefix: np.ndarray | None, packs: np.ndarray
) -> np.ndarray:
    """Costs of the packs `packs` only, from the CSR segment table (the same sums as `CostModel.packs`, `prefix`
    included: a shared-prompt completion's attention over its prompt)."""
    packs = np.asarray(packs, np.int64)
    po = np.asarray(pack_offsets)
    starts, ends = po[packs].astype(np.int64), po[packs + 1].astype(np.int64)
    counts = ends - starts
    bounds = np.concatenate(([0], np.cumsum(counts)))
    idx = np.arange(int(bounds[-1]), dtype=np.int64) + np.repeat(starts - bounds[:-1], counts)
    lens = np.asarray(seg_lens)[idx].astype(np.int64)
    return _sum_costs(model, counts, lens, None if prefix is None else np.asarray(prefix)[idx].astype(np.int64))


def _sum_costs(model: CostModel, counts: np.ndarray, lens: np.ndarray, prefix: np.ndarray | None) -> np.ndarray:
    """Each pack's cost from its segments' lengths (`counts[i]` segments each, in order) and attended prefixes."""
    bounds = np.concatenate(([0], np.cumsum(counts)))
    c1 = np.concatenate(([0], np.cumsum(lens)))
    sq = lens * lens
    if prefix is not None:
        sq += 2 * lens * prefix
    c2 = np.concatenate(([0], np.cumsum(sq)))
    return model.combine(c1[bounds[1:]] - c1[bounds[:-1]], c2[bounds[1:]] - c2[bounds[:-1]])


def _segments(data: Any, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`(pack_offsets, seg_lens, attended prefix)` of the packs behind `data`, read from the pack store's CSR
    companions (never the pack rows): a `PackedDataset`, or anything with those arrays (a `PackSplit`); the
    prefix (`attended_prefix`) is None except for a shared-prompt store."""
    if isinstance(data, PackedDataset):
        store = open_pack_split(data.directory, data.split, data.size)
        po, lens, role = store.pack_offsets, store.seg_lens, store.seg_role
    elif hasattr(data, "pack_offsets") and hasattr(data, "seg_lens"):
        po, lens, role = data.pack_offsets, data.seg_lens, getattr(data, "seg_role", None)
    else:
        raise ConfigError(
            f"balance needs each pack's segment lengths, got a {type(data).__name__}, PackedSampler, pass the PackedDataset itself"
        )
    po = np.asarray(po, np.int64)
    if po.size != n + 1:
        raise ConfigError(
            f"the segment table describes {po.size - 1} packs but the sampler has {n}, PackedSampler, pass the PackedDataset itself"
        )
    return po, np.asarray(lens), attended_prefix(lens, role)


class ResumableLoader:
    """Wraps a `DataLoader` over a `PackedSampler` (or a `DynamicBatchSampler` as its `batch_sampler`)
    and counts the batches the loop received.

    Each `iter()` runs one epoch (the remaining part, after a resume); once an epoch is fully
    consumed the next `iter()` moves to the next epoch's shuffle by itself.
    """

    def __init__(self, loader: torch.utils.data.DataLoader) -> None:  # type: ignore[type-arg]
        sampler: PackedSampler | DynamicBatchSampler
        if isinstance(loader.batch_sampler, DynamicBatchSampler):
            sampler, self.step = loader.batch_sampler, 1  # one batch = one batch of the plan
        elif isinstance(loader.sampler, PackedSampler) and loader.batch_size is not None:
            sampler, self.step = loader.sampler, int(loader.batch_size)
        else:
            raise ConfigError(
                "ResumableLoader needs DataLoader(..., sampler=PackedSampler(...), batch_size=B) or DataLoader(..., batch_sampler=DynamicBatchSampler(...)), pass those to the DataLoader"
            )
        self.loader = loader
        self.sampler = sampler

    def __iter__(self) -> Iterator[Any]:
        if self.sampler.exhausted:
            self.sampler.set_epoch(self.sampler.epoch + 1)
        for batch in self.loader:
            self.sampler.advance(self.step)  # the last batch may be short; advance clamps
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
