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
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch

from packtool.errors import ConfigError
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

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's full index list for `epoch` (default: the current one)."""
        e = self.epoch if epoch is None else epoch
        order = np.random.default_rng([self.seed, e]).permutation(self.n) if self.shuffle else np.arange(self.n)
        total = self.num_samples * self.num_replicas
        if total > self.n:  # pad by wrapping around, as DistributedSampler does
            order = np.concatenate([order, np.resize(order, total - self.n)])
        return order[:total][self.rank :: self.num_replicas]

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
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state`; refuses a state taken with another dataset, seed or world size."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(
                f"sampler state version {state.get('version')!r} is not {STATE_VERSION}, PackedSampler.load_state_dict, use a checkpoint from this packtool"
            )
        for key in ("n", "seed", "num_replicas", "shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                raise ConfigError(
                    f"sampler state has {key}={state[key]!r} but this sampler has {getattr(self, key)!r}, PackedSampler.load_state_dict, resume with the same dataset, seed and world size"
                )
        self.epoch = int(state["epoch"])
        self.consumed = int(state["consumed"])


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
