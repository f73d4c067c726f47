"""Sharded tokenization: which contiguous chunk range each shard owns, and its manifest entry.

A run cut into N shards gives shard I the CONTIGUOUS chunk range `[floor(I*C/N), floor((I+1)*C/N))`
of the C chunks the single run would plan (chunks depend only on the inputs and `--chunk-bytes`,
never on workers or shards). Every shard runs independently (a Slurm array task, a node), with its
own resume journal; `packtool merge` concatenates them in shard order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, TypeVar

from packtool.errors import ConfigError

T = TypeVar("T")


def shard_bounds(n_chunks: int, num_shards: int, shard_index: int) -> tuple[int, int]:
    """The chunk range `[start, end)` of one shard (contiguous, balanced by chunk count)."""
    if num_shards < 1:
        raise ConfigError(f"--num-shards must be at least 1, got {num_shards}, pass a positive count")
    if not 0 <= shard_index < num_shards:
        raise ConfigError(
            f"--shard-index {shard_index} is outside 0..{num_shards - 1} for --num-shards {num_shards}, "
            "pass an index below the shard count (Slurm: --shard-index $SLURM_ARRAY_TASK_ID)"
        )
    return shard_index * n_chunks // num_shards, (shard_index + 1) * n_chunks // num_shards


def shard_slice(items: Sequence[T], num_shards: int, shard_index: int) -> list[T]:
    start, end = shard_bounds(len(items), num_shards, shard_index)
    return list(items[start:end])


def shard_build(build: str, num_shards: int, shard_index: int) -> str:
    """A shard's own build id: a shard store must never pass for the full store."""
    return hashlib.sha256(f"{build}|shard {shard_index}/{num_shards}".encode()).hexdigest()


def shard_entry(build: str, n_chunks: int, num_shards: int, shard_index: int) -> dict[str, Any]:
    """The manifest's `shard` entry: enough for merge to check completeness and order."""
    start, end = shard_bounds(n_chunks, num_shards, shard_index)
    return {
        "index": shard_index,
        "count": num_shards,
        "chunk_start": start,
        "chunk_end": end,
        "n_chunks": n_chunks,
        "build": build,
    }
