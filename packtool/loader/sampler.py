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

from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch

from packtool.core.balance import DEFAULT_WINDOW, check_balance
from packtool.core.cost import CostModel
from packtool.errors import ConfigError
from packtool.loader.blend import BlendedDataset
from packtool.loader.sampler_costs import segments_of
from packtool.loader.sampler_state import HEAD_STATE_VERSION, STATE_VERSION, check_epoch, load_state, state_of
from packtool.loader.sampler_windows import WindowedLayout

__all__ = ["HEAD_STATE_VERSION", "LAZY_ABOVE", "STATE_VERSION", "PackedSampler"]


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


LAZY_ABOVE = 1 << 26
"""Plain datasets with more packs than this are shuffled by an on-the-fly seeded permutation (`blend.permute`)
instead of `numpy`'s stored one (512 MiB of int64 at this size); the state names which (`order`)."""
_CHUNK = 1 << 14  # indices computed per step of a lazy iteration


class PackedSampler(WindowedLayout, torch.utils.data.Sampler[int]):
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
        if isinstance(data, bool) or not isinstance(data, (int, np.integer, Sized)):  # 5.5 raised TypeError
            raise ConfigError(
                f"data {data!r} is no dataset, PackedSampler, pass a PackedDataset, a BlendedDataset, anything sized "
                "or a count of packs"
            )
        self.n = int(data) if isinstance(data, (int, np.integer)) else len(data)
        # a seed of 1.5, 2.5 ranks or shuffle="no" were truncated or truthy: refused by name
        for name, value, low in (("num_replicas", num_replicas, 1), ("rank", rank, 0), ("seed", seed, 0)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low
            ):
                raise ConfigError(
                    f"{name} must be an integer >= {low}, got {value!r}, PackedSampler, pass e.g. {name}={low}"
                )
        for name, value in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(value, (bool, np.bool_)):
                raise ConfigError(f"{name} must be True or False, got {value!r}, PackedSampler, pass {name}=True")
        shuffle, drop_last = bool(shuffle), bool(drop_last)
        self.num_replicas = world if num_replicas is None else int(num_replicas)
        self.rank = me if rank is None else int(rank)
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ConfigError(
                f"rank {self.rank} is not in 0..{self.num_replicas - 1}, PackedSampler, pass 0 <= rank < num_replicas"
            )
        if self.n <= 0:
            raise ConfigError(f"the dataset has no packs (n={self.n}), PackedSampler, pack a non-empty split")
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
                self._table = segments_of(data, self.n)  # memory maps: priced window by window
            else:
                # a shared-prompt completion also attends its prompt: priced as prompt + completion
                self.costs = self.balance.packs(*segments_of(data, self.n))
        self._cache: tuple[tuple[int, int], np.ndarray] | None = None
        self._perm: tuple[int, np.ndarray] | None = None
        self.head: dict[str, Any] | None = None  # the layout whose interrupted window this one starts with
        self.pre: int | None = None  # samples consumed before this layout began (None: `base`)
        self._head_cache: tuple[int, np.ndarray, np.ndarray] | None = None

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The global order of `epoch` over all ranks (rank r's share is `order[r::num_replicas]`), from `base`.

        Materialises the whole epoch: for a blend or a huge dataset, iterate instead."""
        e = self.epoch if epoch is None else self._epoch(epoch)
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
            return self.order(epoch)[self.rank :: self.num_replicas].copy()  # (order checks the epoch)
        e = self.epoch if epoch is None else self._epoch(epoch)
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

    def _epoch(self, epoch: int) -> int:
        """`epoch` of `order(epoch)` / `indices(epoch)`, refused unless an integer >= 0 (1.5 read epoch 1)."""
        check_epoch(self, epoch, "PackedSampler.order")
        return int(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Select the shuffle of `epoch`; a NEW epoch starts from its first index.

        Setting the epoch it already has keeps the consumed count, so the usual
        `sampler.set_epoch(epoch)` at the top of a resumed epoch does not lose the resume point.
        """
        check_epoch(self, epoch, "PackedSampler.set_epoch")
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.consumed = 0
            self.base = 0
            self.head, self.pre, self._head_cache = None, None, None

    def advance(self, n: int) -> None:
        """Record that the training loop consumed `n` more indices of this epoch."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:  # -5 moved the resume point back
            raise ConfigError(f"advance({n!r}) is not a count >= 0, PackedSampler.advance, pass the indices consumed")
        self.consumed = min(self.num_samples, self.consumed + int(n))

    @property
    def exhausted(self) -> bool:
        return self.consumed >= self.num_samples

    def state_dict(self) -> dict[str, Any]:
        return state_of(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state`: at the same world size exactly where it was, at another from the same global
        sample; refuses a state taken with another dataset or blend, seed, order or balancing."""
        load_state(self, state)
