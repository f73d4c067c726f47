"""The runtime side (needs torch): pack store or token store -> GPU batches with `cu_seqlens`.

Depends only on `packtool.formats` (and the torch-free planner `packtool.core.batching`); never imports
typer, tqdm or tokenizers, so a training job pays for torch and numpy only.

- fixed packs: `PackedDataset` + `PackedCollator` (+ `PackedSampler`, `ResumableLoader`);
  `PackedCollator(cp_size=C, cp_rank=r)` for context parallelism;
- documents: `DocumentDataset` + `PackedCollator(flatten=True)` (padding-free minibatches) or
  `PaddedCollator` (`[B, L]` + `attention_mask`), batched by `DynamicBatchSampler` under a token budget;
- blends: `BlendedDataset([(store, weight), ...])` mixes pack stores at load time (exact counts, every
  prefix within 2 samples of each store's share) under `PackedSampler`, resumable at any world size;
- both samplers take `balance=CostModel(...)` so data-parallel ranks get equal work per step.
"""

from __future__ import annotations

from packtool.core.cost import CostModel
from packtool.loader.blend import BlendedDataset
from packtool.loader.collator import HF_KEYS, PackedCollator, validate_cu_seqlens
from packtool.loader.dataset import PackedDataset
from packtool.loader.documents import DocumentDataset
from packtool.loader.dynamic import DynamicBatchSampler
from packtool.loader.kernels import IGNORE_INDEX
from packtool.loader.padded import PaddedCollator
from packtool.loader.prefetch import DevicePrefetcher
from packtool.loader.resumable import ResumableLoader
from packtool.loader.sampler import PackedSampler

__all__ = [
    "BlendedDataset",
    "CostModel",
    "DevicePrefetcher",
    "HF_KEYS",
    "IGNORE_INDEX",
    "DocumentDataset",
    "DynamicBatchSampler",
    "PackedCollator",
    "PackedDataset",
    "PackedSampler",
    "PaddedCollator",
    "ResumableLoader",
    "validate_cu_seqlens",
]
