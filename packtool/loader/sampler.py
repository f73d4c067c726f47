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

from packtool.core.balance import DEFAULT_WINDOW, balanced_order, check_balance, epoch_order
from packtool.core.cost import CostModel
from packtool.errors import ConfigError
from packtool.formats.pack_store import attended_prefix, open_pack_split
from packtool.loader.dataset import PackedDataset
from packtool.loader.dynamic import DynamicBatchSampler

STATE_VERSION = 1


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


class PackedSampler(torch.utils.data.Sampler[int]):
    """Shards packs across ranks with a seeded per-epoch shuffle, and resumes mid-epoch.

    Like `DistributedSampler`: every rank draws the same permutation of `seed` and `epoch`,
    pads it (or with `drop_last`, cuts it) to a multiple of `num_replicas`, and takes every
    `num_replicas`-th index from `rank`. Unlike it, it remembers how many of this epoch's
    indices were consumed (`advance`) and starts after them on the next `__iter__`.

    balance: a `CostModel` (or a `(per_token, per_token_sq)` pair); each global step's `num_replicas * micro_batches` packs are then dealt
        so that the ranks' costs are as equal as possible, moving packs only inside windows of
        `window` consecutive steps of the plain order (`packtool.core.balance`). Needs a
        `PackedDataset` (its segment lengths price the packs). None: the plain order, unchanged.
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
        self.num_samples = self.n // self.num_replicas if drop_last else -(-self.n // self.num_replicas)
        self.epoch = 0
        self.consumed = 0  # indices of this epoch already consumed by the training loop (this rank)
        check_balance(self.num_replicas, micro_batches, window)
        self.balance = None if balance is None else CostModel.coerce(balance, "PackedSampler")
        self.micro_batches, self.window = int(micro_batches), int(window)
        # a shared-prompt completion also attends its prompt: priced as prompt + completion (attended_prefix)
        self.costs = None if self.balance is None else self.balance.packs(*_segments(data, self.n))
        self._cache: tuple[int, np.ndarray] | None = None

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The global order of `epoch` over all ranks (rank r's share is `order[r::num_replicas]`)."""
        e = self.epoch if epoch is None else int(epoch)
        if self._cache is not None and self._cache[0] == e:
            return self._cache[1]
        order = epoch_order(
            self.n, self.seed, e, shuffle=self.shuffle, world=self.num_replicas, drop_last=self.drop_last
        )
        if self.costs is not None:
            order = balanced_order(
                order,
                self.costs,
                world=self.num_replicas,
                micro_batches=self.micro_batches,
                window=self.window,
                seed=self.seed,
                epoch=e,
            )
        order.flags.writeable = False  # cached: shared by every call for this epoch
        self._cache = (e, order)
        return order

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's full index list for `epoch` (default: the current one)."""
        return self.order(epoch)[self.rank :: self.num_replicas].copy()

    def __iter__(self) -> Iterator[int]:
        start = self.consumed  # read NOW: DataLoader creates this iterator before any advance
        return iter(self.indices()[start:].tolist())

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

    def advance(self, n: int) -> None:
        """Record that the training loop consumed `n` more indices of this epoch."""
        self.consumed = min(self.num_samples, self.consumed + int(n))

    @property
    def exhausted(self) -> bool:
        return self.consumed >= self.num_samples

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "n": self.n,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "balance": None if self.balance is None else self.balance.to_dict(),
            "micro_batches": self.micro_batches,
            "window": self.window,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state`; refuses a state taken with another dataset, seed or world size."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(
                f"sampler state version {state.get('version')!r} is not {STATE_VERSION}, PackedSampler.load_state_dict, use a checkpoint from this packtool"
            )
        mine = self.state_dict()
        keys = ["n", "seed", "num_replicas", "shuffle", "drop_last", "balance"]
        if self.balance is not None:  # the plan depends on these only when balancing
            keys += ["micro_batches", "window"]
        for key in keys:
            theirs = state.get(key)  # a state from before balancing has no `balance` (None: plain)
            if theirs != mine[key]:
                raise ConfigError(
                    f"sampler state has {key}={theirs!r} but this sampler has {mine[key]!r}, PackedSampler.load_state_dict, resume with the same dataset, seed, world size and balancing"
                )
        self.epoch = int(state["epoch"])
        self.consumed = int(state["consumed"])


def _segments(data: Any, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`(pack_offsets, seg_lens, attended prefix)` of the packs behind `data`, read from the pack store's CSR
    companions (never the pack rows): a `PackedDataset`, or anything with those arrays (a `PackSplit`)."""
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
