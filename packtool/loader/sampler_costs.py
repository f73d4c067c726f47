"""What balancing prices: each pack's cost from the CSR segment table of its store (`CostModel`'s sums)."""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.core.cost import CostModel
from packtool.errors import ConfigError
from packtool.formats.pack_store import attended_prefix, open_pack_split
from packtool.loader.dataset import PackedDataset


def costs_of(
    model: CostModel, pack_offsets: np.ndarray, seg_lens: np.ndarray, prefix: np.ndarray | None, packs: np.ndarray
) -> np.ndarray:
    """Costs of the packs `packs` only, from the CSR segment table (the same sums as `CostModel.packs`, `prefix`
    included: a shared-prompt completion's attention over its prompt)."""
    packs = np.asarray(packs, np.int64)
    po = np.asarray(pack_offsets)
    starts, ends = po[packs].astype(np.int64), po[packs + 1].astype(np.int64)
    counts = ends - starts
    bounds = np.concatenate(([0], np.cumsum(counts)))
    idx = np.arange(int(bounds[-1]), dtype=np.int64) + np.repeat(starts - bounds[:-1], counts)
    lens = np.asarray(seg_lens)[idx].astype(np.int64)
    return sum_costs(model, counts, lens, None if prefix is None else np.asarray(prefix)[idx].astype(np.int64))


def sum_costs(model: CostModel, counts: np.ndarray, lens: np.ndarray, prefix: np.ndarray | None) -> np.ndarray:
    """Each pack's cost from its segments' lengths (`counts[i]` segments each, in order) and attended prefixes."""
    bounds = np.concatenate(([0], np.cumsum(counts)))
    c1 = np.concatenate(([0], np.cumsum(lens)))
    sq = lens * lens
    if prefix is not None:
        sq += 2 * lens * prefix
    c2 = np.concatenate(([0], np.cumsum(sq)))
    return model.combine(c1[bounds[1:]] - c1[bounds[:-1]], c2[bounds[1:]] - c2[bounds[:-1]])


def segments_of(data: Any, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`(pack_offsets, seg_lens, attended prefix)` of the packs behind `data`, read from the pack store's CSR
    companions (never the pack rows): a `PackedDataset`, or anything with those arrays (a `PackSplit`); the
    prefix (`attended_prefix`) is None except for a shared-prompt store."""
    if isinstance(data, PackedDataset):
        store = open_pack_split(data.directory, data.split, data.size)
        po, lens, role = store.pack_offsets, store.seg_lens, store.seg_role
    elif hasattr(data, "pack_offsets") and hasattr(data, "seg_lens"):
        po, lens, role = data.pack_offsets, data.seg_lens, getattr(data, "seg_role", None)
    else:
        raise ConfigError(
            f"balance needs each pack's segment lengths, got a {type(data).__name__}, PackedSampler, pass the PackedDataset itself"
        )
    po = np.asarray(po, np.int64)
    if po.size != n + 1:
        raise ConfigError(
            f"the segment table describes {po.size - 1} packs but the sampler has {n}, PackedSampler, pass the PackedDataset itself"
        )
    return po, np.asarray(lens), attended_prefix(lens, role)
