"""Sharded tokenization: which chunks a shard owns, and `merge_shards` joining shard stores.

A run cut into N shards gives shard I the CONTIGUOUS chunk range
`[floor(I*C/N), floor((I+1)*C/N))` of the C chunks the single run would plan (chunks depend
only on the inputs and `--chunk-bytes`, never on workers or shards). Contiguous ranges make
merging a concatenation in shard order, so the merged store is byte-identical to the single
run, `manifest.json` included: a shard's manifest is the single run's manifest with per-shard
counts, a shard-specific `build`, and one extra `shard` entry (last) that merge removes.
Every shard runs independently (a Slurm array task, a node), with its own resume journal.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from packtool.errors import ConfigError, FormatError, OutputExistsError
from packtool.formats.atomic import atomic_directory
from packtool.formats.token_store import MANIFEST, REJECTS, TokenStore, TokenStoreWriter, open_token_store

T = TypeVar("T")
#: documents copied per block while merging (memory stays flat whatever the shard size)
MERGE_BLOCK_DOCS = 1 << 20
#: manifest keys whose value is per shard (summed or rebuilt by merge); every other key must be equal
_PER_SHARD = {"n_documents", "n_tokens", "n_target_tokens", "files", "sources", "n_rejected", "build", "shard"}
Progress = Callable[[int, int], None]


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


@dataclass(frozen=True)
class MergeResult:
    path: Path
    manifest: dict[str, Any]
    n_shards: int


def merge_shards(
    shard_dirs: Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> MergeResult:
    """Join the shard stores of one sharded run into the store a single run would have written."""
    if not shard_dirs:
        raise ConfigError(
            "merge needs at least one shard directory, pass the --output of every `tokenize --shard-index` run"
        )
    stores = [open_token_store(d, check_hashes=True) for d in shard_dirs]
    stores = _check_shards(stores)
    out = Path(output).expanduser().resolve()
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise OutputExistsError(
            f"output {out} already exists and is not empty, pass --overwrite to replace it or choose another --output"
        )
    first = stores[0].manifest
    total = sum(s.n_tokens for s in stores)
    done = 0
    with atomic_directory(out) as staging:
        writer = TokenStoreWriter(staging, stores[0].dtype)
        try:
            if REJECTS in first["files"]:
                with open(staging / REJECTS, "wb") as rejects:
                    for store in stores:
                        rejects.write((store.path / REJECTS).read_bytes())
            for store in stores:
                for lo in range(0, store.n_documents, MERGE_BLOCK_DOCS):
                    hi = min(lo + MERGE_BLOCK_DOCS, store.n_documents)
                    a, b = int(store.starts[lo]), int(store.boundaries[hi - 1])
                    lengths = np.asarray(store.boundaries[lo:hi], np.int64) - store.starts[lo:hi]
                    loss = None if store.loss is None else store.loss[a:b]
                    writer.append(store.tokens[a:b], lengths, loss)
                    done += b - a
                    if progress:
                        progress(done, total)
            manifest = {
                k: v
                for k, v in first.items()
                if k
                not in (
                    "format",
                    "format_version",
                    "dtype",
                    "n_documents",
                    "n_tokens",
                    "n_target_tokens",
                    "files",
                    "shard",
                )
            }
            manifest["sources"] = _sum_sources([s.manifest for s in stores])
            if "n_rejected" in manifest:
                manifest["n_rejected"] = sum(int(s.manifest.get("n_rejected", 0)) for s in stores)
            manifest["build"] = first["shard"]["build"]
            full = writer.finish(manifest)
        finally:
            writer.close()
    return MergeResult(out, full, len(stores))


def _check_shards(stores: list[TokenStore]) -> list[TokenStore]:
    """Same run, every shard once, in order; raise a ConfigError naming the problem otherwise."""
    for store in stores:
        if "shard" not in store.manifest:
            raise ConfigError(
                f"{store.path} is not a shard (its manifest has no 'shard' entry), "
                "pass only stores written with `tokenize --num-shards N --shard-index I`"
            )
    stores = sorted(stores, key=lambda s: int(s.manifest["shard"]["index"]))
    first = stores[0].manifest
    count = int(first["shard"]["count"])
    for store in stores:
        m = store.manifest
        for key in sorted((set(m) | set(first)) - _PER_SHARD):
            if m.get(key) != first.get(key):
                raise ConfigError(
                    f"shard {store.path} differs from {stores[0].path} in {key!r} "
                    f"({json.dumps(m.get(key))[:80]} vs {json.dumps(first.get(key))[:80]}), "
                    "merge only shards of one run (same inputs, tokenizer, settings, backend)"
                )
        for key in ("count", "n_chunks", "build"):
            if m["shard"][key] != first["shard"][key]:
                raise ConfigError(
                    f"shard {store.path} belongs to another run ({key} {m['shard'][key]} vs {first['shard'][key]}), "
                    "re-run that shard with the same inputs and settings"
                )
    indices = [int(s.manifest["shard"]["index"]) for s in stores]
    if len(set(indices)) != len(indices):
        dup = sorted({i for i in indices if indices.count(i) > 1})
        raise ConfigError(
            f"shard index {dup[0]} is given twice ({', '.join(str(s.path) for s in stores if s.manifest['shard']['index'] == dup[0])}), "
            "pass each shard once"
        )
    missing = sorted(set(range(count)) - set(indices))
    if missing:
        raise ConfigError(
            f"shards {missing[:10]} of {count} are missing, run `packtool tokenize ... --num-shards {count} "
            f"--shard-index I` for them and pass every shard directory"
        )
    end = 0
    for store in stores:
        shard = store.manifest["shard"]
        if int(shard["chunk_start"]) != end:
            raise FormatError(
                f"shard {shard['index']} starts at chunk {shard['chunk_start']} but the previous one ends at {end}, "
                f"{store.path / MANIFEST}, re-run that shard"
            )
        end = int(shard["chunk_end"])
    if end != int(first["shard"]["n_chunks"]):
        raise FormatError(
            f"shards cover chunks 0..{end} of {first['shard']['n_chunks']}, {stores[-1].path / MANIFEST}, re-run the last shard"
        )
    return stores


def _sum_sources(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = [dict(s) for s in manifests[0]["sources"]]
    for m in manifests[1:]:
        for total, part in zip(out, m["sources"], strict=True):
            for key in ("records", "documents", "rejected"):
                total[key] = int(total[key]) + int(part[key])
    return out
