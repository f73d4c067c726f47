"""`ResumableLoader`: a `DataLoader` wrapper that counts the batches the training loop received, so that a
sampler's state describes consumed batches only (whatever `num_workers` and prefetching were)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from packtool.errors import ConfigError
from packtool.loader.dynamic import DynamicBatchSampler
from packtool.loader.sampler import PackedSampler


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
