"""`PackConfig`: every flag of `packtool pack` (and key of a run config's `pack:` section), validated."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from packtool.choices import Algorithm, ExecutorName, Overlong, Split
from packtool.core.mixture import check_fraction, check_weight, split_weight, weight_of
from packtool.core.packing import MAX_CAPACITY
from packtool.errors import UsageError


@dataclass(frozen=True)
class PackConfig:
    """Everything `packtool pack` needs; `pack_store(config)` is the library call."""

    tokens_dir: Path | tuple[Path, ...]
    """The token store to pack (a `packtool tokenize` output directory), or several of one tokenizer (a mixture)."""
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
    """Parallel pack-block writers; None = all cores, and never more than the cores (`exec.worker_count`).
    Output bytes never depend on it."""
    executor: ExecutorName = ExecutorName.LOCAL
    """Where pack blocks are written: local (a thread pool) or ray (Ray tasks, shared file system)."""
    ray_address: str | None = None
    """Ray cluster to join with executor ray; None starts a local Ray with num_cpus = workers."""
    weights: tuple[float, ...] | None = None
    """Epochs of each store of `tokens_dir`, in order (None: 1 each): integer part repeats every document,
    fractional part adds a seeded subset (`packtool.core.mixture`). `STORE:WEIGHT` on the command line."""
    validation: float | None = None
    """Fraction of documents held out by a hash of their tokens into `validation_N` (same run, own line)."""
    vision_budget: int | None = None
    """A second capacity: at most this many vision-encoder patches per pack (image stores only; None: no bound)."""
    share_prompt: bool = False
    """Preference stores only: hold each pair's prompt once, as segments [prompt][chosen completion][rejected
    completion] (positions as each sequence alone); without it a pair is [chosen][rejected]."""

    def stores(self) -> list[tuple[Path, float]]:
        """(token store, weight) of every source, in the order given."""
        paths = [self.tokens_dir] if isinstance(self.tokens_dir, (str, os.PathLike)) else list(self.tokens_dir)
        weights = list(self.weights) if self.weights is not None else [1.0] * len(paths)
        return [(Path(p), float(w)) for p, w in zip(paths, weights, strict=False)]

    @property
    def is_mixture(self) -> bool:
        """Several stores, a weight other than 1 or a validation split: written as pack store format 3."""
        stores = self.stores()
        return len(stores) > 1 or any(w != 1 for _, w in stores) or self.validation is not None

    def validate(self) -> PackConfig:
        """Check every value range before any work; returns self so callers can chain."""
        validate_pack_size(self.size)
        for flag, value, low, fix in (
            ("--seed", self.seed, 0, "pass a non-negative seed"),
            ("--pad-multiple", self.pad_multiple, 1, "leave it out for no padding"),
            ("--workers", self.workers, 1, "leave it out to use all cores"),
            ("--max-docs-per-pack", self.max_docs_per_pack, 1, "leave it out for no cap"),
            ("--vision-budget", self.vision_budget, 1, "leave it out for no bound on patches"),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise UsageError(f"{flag} must be an integer >= {low}, got {value!r}, {fix}")
        if self.pad_multiple > self.size:
            raise UsageError(
                f"--pad-multiple {self.pad_multiple} is larger than --size {self.size}, "
                "pass a multiple that divides the pack size (e.g. 2*CP)"
            )
        paths = [self.tokens_dir] if isinstance(self.tokens_dir, (str, os.PathLike)) else list(self.tokens_dir)
        if not paths:
            raise UsageError("no token store given, pass at least one STORE[:WEIGHT]")
        if self.weights is not None:
            if len(self.weights) != len(paths):  # two keys that contradict each other: a usage error
                raise UsageError(
                    f"{len(self.weights)} weights for {len(paths)} token stores, give one weight per store"
                )
            for p, w in zip(paths, self.weights, strict=True):
                check_weight(w, str(p))
        if self.validation is not None:
            check_fraction(self.validation)
            if str(self.split) == "validation":
                raise UsageError(
                    "--validation writes the split `validation` itself, so --split validation cannot name the "
                    "training part, leave --split out (training) or pass --split test"
                )
        from packtool.exec import parse_executor

        parse_executor(self.executor, self.ray_address)
        if not isinstance(self.share_prompt, bool):
            raise UsageError(
                f"share_prompt must be true or false, got {self.share_prompt!r}, pass --share-prompt or leave it out"
            )
        return self


def validate_pack_size(size: int, flag: str = "--size") -> None:
    """A pack size must be a positive integer the packers support."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise UsageError(f"{flag} must be a positive integer, got {size!r}, pass e.g. {flag} 4096")
    if size > MAX_CAPACITY:
        raise UsageError(f"{flag} {size} is over the supported maximum {MAX_CAPACITY}, use a smaller {flag}")


def parse_store_spec(spec: str) -> tuple[Path, float | None]:
    """`PATH[:WEIGHT]` -> (path, weight or None), by `core.mixture.split_weight`'s rule (shared with `stats` and
    `BlendedDataset`): only a trailing `:NUMBER` is a weight (paths may hold ':'); a whole spec that names an
    existing path, when the part before the colon does not, is a path; `A:abc` with A existing is a bad weight."""
    path, text = split_weight(spec)
    if text is None:
        return Path(spec), None
    return Path(path), weight_of(text, path)


def mixture_args(specs: list[str]) -> tuple[Path | tuple[Path, ...], tuple[float, ...] | None]:
    """`tokens_dir` and `weights` of a `PackConfig` from `PATH[:WEIGHT]` specs (one bare path stays a Path)."""
    parsed = [parse_store_spec(s) for s in specs]
    if len(parsed) == 1 and parsed[0][1] is None:
        return parsed[0][0], None
    weights = tuple(1.0 if w is None else w for _, w in parsed)
    return tuple(p for p, _ in parsed), (None if all(w is None for _, w in parsed) else weights)
