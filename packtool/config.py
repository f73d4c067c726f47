"""Choices and frozen configs shared by the library, the CLI and `packtool run`.

Every CLI flag has the same name as a config key (dashes become underscores), so a YAML
file for `packtool run` is just the flags written down.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path


class StrEnum(str, Enum):
    """A str-valued Enum that typer shows as its choices (stdlib StrEnum is 3.11+)."""

    def __str__(self) -> str:
        return str(self.value)


class InputFormat(StrEnum):
    TEXT = "text"
    PROMPT_COMPLETION = "prompt-completion"
    CHAT = "chat"


class OnError(StrEnum):
    FAIL = "fail"
    SKIP = "skip"


class Algorithm(StrEnum):
    FFD = "ffd"
    BFD = "bfd"
    MFFD = "mffd"
    FFS = "ffs"
    CONCAT = "concat"


class Overlong(StrEnum):
    TRUNCATE = "truncate"
    SPLIT = "split"
    DROP = "drop"
    ERROR = "error"


class Split(StrEnum):
    TRAINING = "training"
    VALIDATION = "validation"
    TEST = "test"


# ---- pack / stats / verify configs (one field per CLI flag, same names) ----


@dataclass(frozen=True)
class PackConfig:
    """Everything `packtool pack` needs; `pack_store(config)` is the library call."""

    tokens_dir: Path
    """The token store to pack (a `packtool tokenize` output directory)."""
    size: int
    """Pack size N in tokens: every row of `{split}_{N}.npy` has exactly N positions."""
    output: Path
    """Pack ROOT: files go to `ROOT/packed/{tokenizer_name}/`."""
    algorithm: Algorithm = Algorithm.BFD
    """Bin-packing algorithm; bfd by default: same pack counts as ffd/mffd (lower bound + 0.004% on lognormal
    lengths) and the fastest of the three in scripts/bench_pack.py."""
    seed: int = 0
    """Seed of the pack-order permutation (and of shuffling algorithms): same seed, same bytes."""
    shuffle: bool = True
    """Permute the pack order (seeded); False keeps the algorithm's order (`--no-shuffle`)."""
    overlong: Overlong = Overlong.SPLIT
    """What to do with a document longer than N (after rounding N down to `pad_multiple`)."""
    pad_multiple: int = 1
    """Round every segment up to a multiple of this with pad tokens (context parallelism)."""
    max_docs_per_pack: int | None = None
    """Cap on segments per pack, so that `cu_seqlens` can have a static length (CUDA graphs)."""
    split: Split = Split.TRAINING
    """Which split this token store becomes; re-packing a split replaces only its files and line."""
    workers: int | None = None
    """Parallel pack-block writers; None = all cores. Output bytes never depend on it."""
    executor: str = "local"
    """Where pack blocks are written: local (a thread pool) or ray (Ray tasks, shared file system)."""
    ray_address: str | None = None
    """Ray cluster to join with executor ray; None starts a local Ray with num_cpus = workers."""


@dataclass(frozen=True)
class StatsConfig:
    """Everything `packtool stats` needs; `compute_stats(config)` is the library call."""

    path: Path
    """A token store directory or a pack store (ROOT, `packed/{tok}` dir or `.npy` file)."""
    size: int | None = None
    """Pack size N for token-store waste ratios (default 4096); selects the size of a pack store."""
    batch_size: int = 8
    """Batch size B for the padded-batch baselines (random batches and length-sorted batches)."""
    seed: int = 0
    """Seed for the random batches and the shuffling algorithms."""
    split: Split = Split.TRAINING
    """Which split of a pack store to describe."""


@dataclass(frozen=True)
class VerifyConfig:
    """Everything `packtool verify` needs; `verify_path(config)` is the library call."""

    path: Path
    """A token store or a pack store (ROOT, `packed/{tok}` dir or `.npy` file)."""
    source: Path | None = None
    """The token store a pack store was made from: check every document's tokens round-trip."""
