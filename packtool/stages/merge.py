"""`packtool merge`: join the shard token stores of one sharded tokenize run.

Shards own contiguous chunk ranges (`packtool.stages.tokenize.shards`), so merging is a
concatenation in shard order, and the merged store is byte-identical to the single run,
`manifest.json` included: a shard's manifest is the single run's manifest with per-shard counts,
a shard-specific `build`, and one extra `shard` entry (last) that merge removes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import ConfigError, FormatError, OutputExistsError
from packtool.formats.locks import exclusive_output
from packtool.formats.media import COUNTS, VISION, MediaWriter
from packtool.formats.oserrors import writing
from packtool.formats.overwrite import check_replaceable
from packtool.formats.token_store import (
    MANIFEST,
    PREFERENCE,
    REJECTS,
    TokenStore,
    open_token_store,
    preference_key,
    write_token_store,
)
from packtool.progress import Progress

#: documents copied per block while merging (memory stays flat whatever the shard size)
MERGE_BLOCK_DOCS = 1 << 20
#: manifest keys whose value is per shard (summed or rebuilt by merge); every other key must be equal
#: manifest keys the writer fills in itself (and the shard entry, which the merged store drops)
_WRITER_KEYS = ("format", "format_version", "dtype", "n_documents", "n_tokens", "n_target_tokens", "files", "shard")
_PER_SHARD = {
    "n_documents",
    "n_tokens",
    "n_target_tokens",
    "files",
    "sources",
    "n_rejected",
    "rejected_by_reason",
    "build",
    "shard",
    PREFERENCE,  # a preference store's pairs: summed (its presence must agree: `_check_preference`)
    VISION,  # a vision store's image counts: summed by the writer (the rest must agree: `_check_vision`)
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
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"output {out} exists and is not a directory, choose another --output or remove it")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise OutputExistsError(
            f"output {out} already exists and is not empty, pass --overwrite to replace it or choose another --output"
        )
    if overwrite:
        check_replaceable(out, list(shard_dirs))
    first = stores[0].manifest
    manifest = {k: v for k, v in first.items() if k not in _WRITER_KEYS}
    manifest.update(_summed_counts(stores, manifest))
    if PREFERENCE in manifest:  # the pairs of every shard, not the first one's
        manifest[PREFERENCE] = preference_key(sum(s.n_documents for s in stores))
    manifest["build"] = first["shard"]["build"]
    total = sum(s.n_tokens for s in stores)
    done = 0
    # one writer per output (a second merge or tokenize fails at once, naming this one); OS errors are one line
    vision = VISION in first
    with writing(out), exclusive_output(out), write_token_store(out, stores[0].dtype, with_media=vision) as writer:
        if REJECTS in first["files"]:
            with open(writer.directory / REJECTS, "wb") as rejects:
                for store in stores:
                    rejects.write((store.path / REJECTS).read_bytes())
        for store in stores:
            _append_media(writer.media, store, writer.n_documents)
            for lo in range(0, store.n_documents, MERGE_BLOCK_DOCS):
                hi = min(lo + MERGE_BLOCK_DOCS, store.n_documents)
                a, b = int(store.starts[lo]), int(store.boundaries[hi - 1])
                lengths = np.asarray(store.boundaries[lo:hi], np.int64) - store.starts[lo:hi]
                loss = None if store.loss is None else store.loss[a:b]
                writer.append(store.tokens[a:b], lengths, loss)
                done += b - a
                if progress:
                    progress(done, total)
        full = writer.finish(manifest)
    return MergeResult(out, full, len(stores))


_SHARD_COUNTS = ("index", "count", "chunk_start", "chunk_end", "n_chunks")


def _entry(store: TokenStore) -> dict[str, Any]:
    """The manifest's `shard` entry, checked: every count an integer >= 0 and in order, `build` a string.

    A hand-edited or damaged entry (`"index": "x"`, `"count": 1e400`) was a ValueError traceback; a count of
    10**12 made a set of that many shard numbers."""
    shard = store.manifest.get("shard")
    where = store.path / MANIFEST
    if not isinstance(shard, dict):
        raise ConfigError(
            f"{store.path} is not a shard (its manifest has no 'shard' entry), "
            "pass only stores written with `tokenize --num-shards N --shard-index I`"
        )
    for key in _SHARD_COUNTS:
        value = shard.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise FormatError(
                f"the shard entry's {key!r} must be an integer >= 0, got {json.dumps(value)[:40]}, {where}, "
                "re-run that shard"
            )
    if not isinstance(shard.get("build"), str):
        raise FormatError(f"the shard entry's 'build' is not a string, {where}, re-run that shard")
    if not (shard["index"] < shard["count"] and shard["chunk_start"] <= shard["chunk_end"] <= shard["n_chunks"]):
        raise FormatError(
            f"the shard entry is inconsistent (index {shard['index']} of {shard['count']}, chunks "
            f"{shard['chunk_start']}..{shard['chunk_end']} of {shard['n_chunks']}), {where}, re-run that shard"
        )
    return shard


def _check_shards(stores: list[TokenStore]) -> list[TokenStore]:
    """Same run, every shard once, in order; raise a ConfigError naming the problem otherwise."""
    entries = {id(store): _entry(store) for store in stores}
    stores = sorted(stores, key=lambda s: int(entries[id(s)]["index"]))
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
    _check_preference(stores)
    _check_vision(stores)
    indices = [int(s.manifest["shard"]["index"]) for s in stores]
    if len(set(indices)) != len(indices):
        dup = sorted({i for i in indices if indices.count(i) > 1})
        raise ConfigError(
            f"shard index {dup[0]} is given twice ({', '.join(str(s.path) for s in stores if s.manifest['shard']['index'] == dup[0])}), "
            "pass each shard once"
        )
    if len(indices) != count:  # the first ten numbers missing, found without a set of `count` of them
        given, missing, i = set(indices), list[int](), 0
        while len(missing) < 10 and i < count:
            if i not in given:
                missing.append(i)
            i += 1
        raise ConfigError(
            f"shards {missing} of {count} are missing, run `packtool tokenize ... --num-shards {count} "
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


def _check_preference(stores: list[TokenStore]) -> None:
    """Preference shards merge only with preference shards, each whole (an even document count, its pair count
    consistent: `TokenStore.preference_pairs`), so the merged store's document 2i is still pair i's chosen one."""
    kinds = {store.path: store.preference_pairs for store in stores}  # a damaged pair count is a FormatError
    pref = [p for p, n in kinds.items() if n is not None]
    plain = [p for p, n in kinds.items() if n is None]
    if pref and plain:
        raise ConfigError(
            f"shard {pref[0]} is a preference store (pairs of chosen and rejected sequences) but {plain[0]} is not, "
            "merge only shards of one run (`tokenize --format preference` for every shard)"
        )


def _check_vision(stores: list[TokenStore]) -> None:
    """Image shards merge only with image shards of the same processor (its counts are per shard)."""
    first = stores[0]
    for store in stores:
        mine, theirs = store.manifest.get(VISION), first.manifest.get(VISION)
        same = (mine is None) == (theirs is None)
        if isinstance(mine, dict) and isinstance(theirs, dict):
            same = {k: v for k, v in mine.items() if k not in COUNTS} == {
                k: v for k, v in theirs.items() if k not in COUNTS
            }
        if not same:
            raise ConfigError(
                f"shard {store.path} differs from {first.path} in 'vision' (its images or image processor), "
                "merge only shards of one run (same inputs, tokenizer, settings, backend)"
            )


def _append_media(media: MediaWriter | None, store: TokenStore, shift: int) -> None:
    """The shard's image rows, their documents shifted by the documents before it (bytes deduplicated again)."""
    table = store.media
    if media is None or table is None:
        return
    for i in range(len(table)):
        grid = (int(table.grid[i, 0]), int(table.grid[i, 1]), int(table.grid[i, 2]))
        media.add(
            int(table.doc[i]) + shift, table.offset[i], table.n_tokens[i], grid, table.n_patches[i], table.data(i)
        )


def _summed_counts(stores: list[TokenStore], keys: dict[str, Any]) -> dict[str, Any]:
    """The per-shard counts summed (`sources`' records/documents/rejected, `n_rejected`, `rejected_by_reason`),
    before anything is written; a count that is not one is a FormatError naming the shard's manifest."""
    store = stores[0]
    try:
        out: dict[str, Any] = {"sources": [dict(s) for s in store.manifest["sources"]]}
        for store in stores[1:]:
            for total, part in zip(out["sources"], store.manifest["sources"], strict=True):
                for key in ("records", "documents", "rejected"):
                    total[key] = _count(total[key]) + _count(part[key])
        if "n_rejected" in keys:
            out["n_rejected"] = sum(_count(s.manifest.get("n_rejected", 0)) for s in stores)
        if "rejected_by_reason" in keys:
            reasons: dict[str, int] = {}
            for store in stores:
                for kind, n in store.manifest.get("rejected_by_reason", {}).items():
                    reasons[kind] = reasons.get(kind, 0) + _count(n)
            out["rejected_by_reason"] = dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FormatError(
            f"the shard's per-shard counts (sources, n_rejected, rejected_by_reason) are damaged "
            f"({type(exc).__name__}: {str(exc)[:80]}), {store.path / MANIFEST}, re-run that shard"
        ) from None
    return out


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{json.dumps(value)[:40]} is not a count")
    return value
