"""Packing a preference token store: pair items -> packing algorithm -> segments in pack order (no I/O).

A store is a preference store only by its manifest's `preference` key (`TokenStore.preference_pairs`);
a mixture must be all preference stores or none (a plain document has no partner). Each pair is ONE
item of the chosen packing algorithm (`core.packing.pairs`), so a pack holds whole pairs and the pack
count is measured against `ceil(sum of item lengths / N)`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from packtool.core.packing import lower_bound, pack_lengths
from packtool.core.packing.pairs import PairItems, build_pair_items, pair_scan
from packtool.core.packing.segments import Segments, expand_runs
from packtool.errors import ConfigError, UsageError
from packtool.formats.store_set import StoreSet
from packtool.stages.pack.config import PackConfig
from packtool.stages.pack.layout import Layout, _place


def is_preference(stores: StoreSet) -> bool:
    """Whether the stores hold preference pairs: all of them (True), none (False), else a ConfigError naming
    the store that differs."""
    flags = [s.preference_pairs is not None for s in stores.stores]
    if any(flags) and not all(flags):
        plain = stores.stores[flags.index(False)].path
        pref = stores.stores[flags.index(True)].path
        raise ConfigError(
            f"{plain} is a plain token store and {pref} a preference store (pairs), pack, a mixture cannot mix "
            "documents with pairs: pack them into separate --output roots"
        )
    return bool(flags) and all(flags)


def check_pair_config(config: PackConfig, preference: bool) -> None:
    """Flags that mean something else (or nothing) for pairs, refused by name before any work."""
    if not preference:
        if config.share_prompt:
            raise UsageError(
                f"--share-prompt needs a preference token store (pairs), {config.stores()[0][0]} holds documents, "
                "tokenize with `--format preference` or leave --share-prompt out"
            )
        return
    per_item = 3 if config.share_prompt else 2
    if config.max_docs_per_pack is not None and config.max_docs_per_pack < per_item:
        raise UsageError(
            f"--max-docs-per-pack {config.max_docs_per_pack} cannot hold one pair ({per_item} segments"
            f"{' with --share-prompt' if config.share_prompt else ''}), pass at least {per_item}"
        )
    if config.share_prompt and config.pad_multiple != 1:
        raise UsageError(
            f"--pad-multiple {config.pad_multiple} with --share-prompt: the prompt's padding would sit between the "
            "prompt and its completions, leave --pad-multiple out or pack without --share-prompt"
        )


def max_pairs_per_pack(config: PackConfig) -> int | None:
    """`--max-docs-per-pack K` counts segments: K // 3 pairs with a shared prompt (a pair held as two whole
    sequences counts as 3 too, so the cap is never exceeded), K // 2 without."""
    if config.max_docs_per_pack is None:
        return None
    return config.max_docs_per_pack // (3 if config.share_prompt else 2)


def global_scan(stores: StoreSet) -> np.ndarray:
    """`pair_scan` of every store, concatenated: `[3, n_global_pairs]` (pairs never cross stores)."""
    parts = [pair_scan(s.tokens, s.loss, s.starts, s.lengths) for s in stores.stores]
    return np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), np.int64)


def pair_items(stores: StoreSet, pairs: np.ndarray, scan: np.ndarray, config: PackConfig) -> PairItems:
    return build_pair_items(
        pairs,
        stores.starts,
        stores.lengths,
        scan,
        config.size,
        config.overlong,
        config.pad_multiple,
        config.share_prompt,
        _where(config),
    )


def _where(config: PackConfig) -> str:
    """The token store(s) an over-long pair error names (`pair i` counts the pairs of them all, in order)."""
    paths = [config.tokens_dir] if isinstance(config.tokens_dir, (str, os.PathLike)) else list(config.tokens_dir)
    return ", ".join(str(p) for p in paths)


def plan_pair_layout(items: PairItems, config: PackConfig) -> tuple[Layout, np.ndarray]:
    """Pack the pair items and lay out their segments in pack order: `(layout, role per segment)`."""
    n_items = int(items.pair.size)
    if n_items == 0:
        offsets, order = np.zeros(1, np.int64), np.zeros(0, np.int64)
    else:
        offsets, order = pack_lengths(
            items.lengths,
            config.size,
            algorithm=str(config.algorithm),
            seed=config.seed,
            shuffle=config.shuffle,
            max_items_per_pack=max_pairs_per_pack(config),
        )
        offsets, order = np.asarray(offsets, np.int64), np.asarray(order, np.int64)
    per_item = items.segments_per_item[order]
    (seg_order,) = expand_runs(per_item, items.item_offsets[:-1][order])
    seg_ends = np.concatenate(([0], np.cumsum(per_item)))
    seg_offsets = seg_ends[offsets]
    doc, src, real, pad, dst = _place(seg_order, seg_offsets, items.doc, items.src, items.real, items.pad, config.size)
    return Layout(seg_offsets, doc, src, real, pad, dst), items.role[seg_order]


def as_segments(items: PairItems, n_empty_documents: int) -> Segments:
    """The items' segments seen as `Segments` (input order), for the metadata numbers shared with documents."""
    return Segments(
        doc=items.doc,
        src=items.src,
        real=items.real,
        pad=items.pad,
        n_overlong=items.n_overlong,
        n_empty=n_empty_documents,
        n_dropped_tokens=items.n_dropped_tokens,
    )


def preference_record(items: PairItems, config: PackConfig) -> dict[str, Any]:
    """The metadata's `preference` key: layout, pair counts, what the over-long policy did, prompt savings."""
    packed = int(items.pair.size)
    sequence_tokens = int(items.real.sum()) + items.n_prompt_tokens_saved  # as if each sequence were whole
    return {
        "layout": "shared-prompt" if config.share_prompt else "pairs",
        "pairs": items.n_pairs,
        "n_packed_pairs": packed,
        "n_empty_pairs": items.n_empty,
        "overlong": {
            "policy": str(config.overlong),
            "count": items.n_overlong,
            "truncated": items.n_truncated,
            "dropped": items.n_dropped,
        },
        "sequence_tokens": sequence_tokens,
        "prompt_tokens_saved": items.n_prompt_tokens_saved,
    }


def pair_lower_bound(items: PairItems, config: PackConfig) -> int:
    """Fewest packs any packer can reach on these pair items."""
    return lower_bound(items.lengths, config.size, max_pairs_per_pack(config))


def selected_pairs(docs: np.ndarray | None, n_pairs: int) -> np.ndarray:
    """Global pair indices of a selection (documents in (chosen, rejected) order), or every pair."""
    if docs is None:
        return np.arange(n_pairs, dtype=np.int64)
    return np.asarray(docs, np.int64)[0::2] // 2
