"""The runtime side (needs torch): pack store -> GPU batches with `cu_seqlens`.

Depends only on `packtool.formats`; never imports typer, tqdm or tokenizers, so a training
job pays for torch and numpy only.
"""

from __future__ import annotations

from packtool.loader.collator import HF_KEYS, PackedCollator, validate_cu_seqlens
from packtool.loader.dataset import PackedDataset
from packtool.loader.kernels import IGNORE_INDEX
from packtool.loader.sampler import PackedSampler, ResumableLoader

__all__ = [
    "HF_KEYS",
    "IGNORE_INDEX",
    "PackedCollator",
    "PackedDataset",
    "PackedSampler",
    "ResumableLoader",
    "validate_cu_seqlens",
]
