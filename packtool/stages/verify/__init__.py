"""The verify stage (read-only): every invariant and checksum of a token store or a pack store.

A store that opens is not yet a store that is right: hashes only prove the bytes are the ones the
writer hashed. Verify re-derives what the bytes must satisfy (ids below the tokenizer's bound,
padding where padding belongs, metadata counts equal to the arrays) and, with `--source`, that the
packs hold every source document exactly once with identical tokens and loss bits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import ConfigError, FormatError, UsageError
from packtool.formats.pack_store import (
    PackSplit,
    find_pack_dir,
    metadata_name,
    metadata_sources,
    open_pack_split,
    parse_data_name,
    read_metadata,
    sizes_in,
)
from packtool.formats.store_set import StoreSet
from packtool.formats.token_store import MANIFEST, TokenStore
from packtool.progress import Progress
from packtool.stages.pack.mixture import occurrences, select_splits
from packtool.stages.verify.packs import verify_pack_split
from packtool.stages.verify.tokens import verify_token_store

__all__ = ["VerifyConfig", "VerifyReport", "verify_pack_split", "verify_path", "verify_token_store"]


@dataclass(frozen=True)
class VerifyConfig:
    """Everything `packtool verify` needs; `verify_path(config)` is the library call."""

    path: Path
    """A token store or a pack store (ROOT, `packed/{tok}` dir or `.npy` file)."""
    source: Path | tuple[Path, ...] | None = None
    """The token store a pack store was made from (a mixture: every one of its stores, any order):
    check every document's tokens round-trip, as often as the mixture's weights and split say."""

    def sources(self) -> list[Path]:
        if self.source is None:
            return []
        if isinstance(self.source, (str, os.PathLike)):
            return [Path(self.source)]
        return [Path(p) for p in self.source]


@dataclass(frozen=True)
class VerifyReport:
    """What was checked; returned only when every check passed."""

    kind: str  # "tokens" or "packs"
    path: str
    checked: list[str] = field(default_factory=list)  # one line per token store / split checked
    source: str | None = None
    n_bytes: int = 0  # bytes of array data checked (hashes included)


def _splits(path: Path, directory: Path) -> list[tuple[str, int]]:
    """(split, size) pairs to check: the one a `.npy` names, else every line of every `{N}_metadata.jsonl`."""
    if path.is_file():
        named = parse_data_name(path.name)
        if named is None:
            raise FormatError(
                f"{path.name} is not a pack file name ({{split}}_{{N}}.npy), {path}, pass a pack store directory"
            )
        return [named]
    pairs = [(str(rec["split"]), size) for size in sizes_in(directory) for rec in read_metadata(directory, size)]
    if not pairs:
        raise FormatError(f"no split in any *_metadata.jsonl, {directory}, run `packtool pack`")
    return pairs


def verify_path(config: VerifyConfig, progress: Progress | None = None) -> VerifyReport:
    """Verify a token store (a directory with manifest.json) or a pack store; raise FormatError at the first failure."""
    path = Path(config.path)
    if path.is_dir() and (path / MANIFEST).is_file():
        if config.source is not None:
            raise UsageError(f"--source applies to a pack store, {path} is a token store, leave --source out")
        _, line = verify_token_store(path, progress)
        return VerifyReport("token", str(path), [line], n_bytes=_store_bytes(path))
    directory = find_pack_dir(path)
    given = [verify_token_store(p)[0] for p in config.sources()]
    lines = []
    for split, size in _splits(path, directory):
        ps = open_pack_split(directory, split, size, check_hashes=True)
        if not given:
            lines.append(verify_pack_split(ps, None, progress))
            continue
        stores = _sources_of(ps, given, directory / metadata_name(size))
        lines.append(verify_pack_split(ps, stores, progress, expected_occurrences(ps.metadata, stores)))
    n_bytes = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
    named = ", ".join(str(s.path) for s in given) if given else None
    return VerifyReport("pack", str(directory), lines, named, n_bytes)


def _sources_of(ps: PackSplit, given: list[TokenStore], where: Path) -> StoreSet:
    """The given stores in the order the metadata lists the split's sources (matched by manifest sha256)."""
    recorded = metadata_sources(ps.metadata)
    by_sha: dict[str, list[TokenStore]] = {}
    for store in given:
        by_sha.setdefault(store.manifest_sha256, []).append(store)
    picked = []
    for rec in recorded:
        sha = str(rec.get("manifest_sha256"))
        if not by_sha.get(sha):
            if len(recorded) == 1 and len(given) == 1:
                raise FormatError(
                    f"packs were made from another token store: {ps.split}_{ps.size} records source manifest sha256 "
                    f"{sha[:12]}..., {given[0].path / MANIFEST} has {given[0].manifest_sha256[:12]}..., "
                    f"{where}, pass the right --source or re-run `packtool pack` on it"
                )
            raise FormatError(
                f"packs were made from a token store not given: {ps.split}_{ps.size} records source {rec.get('path')} "
                f"(manifest sha256 {sha[:12]}...), {where}, pass one --source per store of the mixture"
            )
        picked.append(by_sha[sha].pop(0) if len(by_sha[sha]) > 1 else by_sha[sha][0])
    listed = [str(r.get("manifest_sha256")) for r in recorded]
    for store in given:  # given more often than the split lists it: the extra copies would be checked as nothing
        times, recorded_times = (
            sum(s.manifest_sha256 == store.manifest_sha256 for s in given),
            listed.count(store.manifest_sha256),
        )
        if times > recorded_times >= 1:
            raise ConfigError(
                f"--source {store.path} is given {times} times but {ps.split}_{ps.size} lists that store "
                f"{recorded_times} time{'s' if recorded_times > 1 else ''}, {where}, pass it once per listing"
            )
    unused = [s for s in given if s.manifest_sha256 not in set(listed)]
    if unused:
        raise FormatError(
            f"packs were made from another token store: {unused[0].path} is not a source of {ps.split}_{ps.size}, "
            f"{where}, pass the right --source or re-run `packtool pack` on it"
        )
    return StoreSet.ordered(picked)


def expected_occurrences(meta: dict[str, Any], stores: StoreSet) -> np.ndarray | None:
    """How many times each global document must be in the split, re-derived from its `mixture` record."""
    mixture = meta.get("mixture")
    if not isinstance(mixture, dict):
        return None
    weights = [float(r.get("weight", 1)) for r in metadata_sources(meta)]
    fraction = (mixture.get("validation") or {}).get("fraction")
    part = mixture.get("part", "training")
    pairs = meta.get("preference") is not None  # a preference split holds pairs out and repeats them whole
    selections = select_splits(stores, weights, int(meta.get("seed", 0)), fraction, str(meta["split"]), pairs)
    chosen = [s for s in selections if s.part == part]
    if not chosen:
        raise FormatError(f"metadata mixture part {part!r} is unknown, split {meta['split']!r}, re-run `packtool pack`")
    return occurrences(stores, chosen[0].docs)


def _store_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
