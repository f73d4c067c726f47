"""Packing documents with images: segments that never cut an image, two capacities, the image CSR.

A store set is a vision set when its stores carry images (`formats.media`); they must agree on the
processor (family, its config, the image token). Images are numbered over the set: store s's rows come
after those of the stores before it (what `img_row` records and the loader resolves). Text-only stores
keep `build_segments` and `pack_lengths` byte for byte; `--vision-budget` on them is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from packtool.core.packing.budget import budget_lower_bound, pack_with_budget
from packtool.core.packing.vision_segments import ImageSpans, VisionSegments, build_vision_segments
from packtool.errors import ConfigError, UsageError
from packtool.formats.media import COUNTS, VISION, runs
from packtool.formats.store_set import StoreSet
from packtool.stages.pack.config import PackConfig
from packtool.stages.pack.layout import Layout, _place


def vision_key(stores: StoreSet, config: PackConfig, preference: bool) -> dict[str, Any] | None:
    """The stores' shared `vision` identity (without counts), None for text-only stores; refusals by name."""
    keys = [s.manifest.get(VISION) for s in stores.stores]
    ident = [None if k is None else {x: v for x, v in k.items() if x not in COUNTS} for k in keys]
    found = [k for k in ident if k is not None]
    if not found:
        if config.vision_budget is not None:
            raise UsageError(
                f"--vision-budget bounds image patches, but {stores.first.path} holds no images, leave --vision-budget out"
            )
        return None
    for store, k in zip(stores.stores, ident, strict=True):
        if k is not None and k != found[0]:
            raise ConfigError(
                f"token store {store.path} was tokenized with another image processor than {stores.first.path} "
                f"({k.get('family')} vs {found[0].get('family')}), mix only stores of one processor"
            )
    if preference:
        raise ConfigError(
            f"{stores.first.path} is a preference store with images: packing image pairs is not supported yet, "
            "tokenize the pairs without images or pack them as SFT records"
        )
    if config.pad_multiple != 1:
        raise UsageError("--pad-multiple with images is not supported yet (M-RoPE positions of padding), leave it out")
    return found[0]


def image_spans(stores: StoreSet, docs: np.ndarray | None) -> ImageSpans:
    """The images of the documents `docs` (global, repeats allowed; None: every document), numbered over the set."""
    parts: list[tuple[np.ndarray, ...]] = []
    row0 = 0
    for s, store in enumerate(stores.stores):
        table = store.media
        if table is None:
            continue
        parts.append(
            (
                table.doc + int(stores.doc_offsets[s]),
                np.asarray(table.offset, np.int64),
                np.asarray(table.n_tokens, np.int64),
                np.asarray(table.n_patches, np.int64),
                np.arange(len(table), dtype=np.int64) + row0,
            )
        )
        row0 += len(table)
    cols = [np.concatenate([p[i] for p in parts]) if parts else np.zeros(0, np.int64) for i in range(5)]
    if docs is None:
        return ImageSpans(*cols)
    docs = np.asarray(docs, np.int64)
    lo = np.searchsorted(cols[0], docs, side="left")
    hi = np.searchsorted(cols[0], docs, side="right")
    pick = runs(lo, hi - lo)
    doc = np.repeat(np.arange(docs.size, dtype=np.int64), hi - lo)
    return ImageSpans(doc, *(c[pick] for c in cols[1:]))


@dataclass(frozen=True)
class VisionPlan:
    segments: VisionSegments
    images: ImageSpans
    layout: Layout
    order: np.ndarray  # segment index of every placed segment (pack order)
    lower_bound: int


def plan_vision(
    stores: StoreSet, docs: np.ndarray | None, starts: np.ndarray, lengths: np.ndarray, config: PackConfig
) -> VisionPlan:
    """Segments (images whole), then both capacities through the chosen algorithm, then placement."""
    images = image_spans(stores, docs)
    budget = config.vision_budget
    vseg = build_vision_segments(starts, lengths, images, config.size, config.overlong, config.pad_multiple, budget)
    seg = vseg.segments
    if len(seg) == 0:
        offsets, order = np.zeros(1, np.int64), np.zeros(0, np.int64)
    else:
        offsets, order = pack_with_budget(
            seg.lengths,
            vseg.patches,
            config.size,
            budget,
            algorithm=str(config.algorithm),
            seed=config.seed,
            shuffle=config.shuffle,
            max_items_per_pack=config.max_docs_per_pack,
        )
    placed = _place(order, offsets, seg.doc, seg.src, seg.real, seg.pad, config.size)
    bound = budget_lower_bound(seg.lengths, vseg.patches, config.size, budget, config.max_docs_per_pack)
    return VisionPlan(vseg, images, Layout(offsets, *placed), order, bound)


def vision_companions(plan: VisionPlan, size: int) -> dict[str, np.ndarray]:
    """The image CSR in pack and row order (`formats.pack_checks.VISION_COMPANIONS`)."""
    vseg, images, layout, order = plan.segments, plan.images, plan.layout, plan.order
    count = vseg.count[order]
    pick = runs(vseg.first[order], count)  # image index (into `images`) of every placed image, in pack order
    seg_of = np.repeat(np.arange(order.size, dtype=np.int64), count)
    pos = (layout.dst % size)[seg_of] + images.offset[pick] - vseg.at[order][seg_of]
    per_pack = np.add.reduceat(count, layout.pack_offsets[:-1]) if count.size else np.zeros(layout.n_packs, np.int64)
    per_pack = np.where(np.diff(layout.pack_offsets) > 0, per_pack, 0)
    pack_img = np.zeros(layout.n_packs + 1, np.int64)
    np.cumsum(per_pack, out=pack_img[1:])
    return {
        "pack_img": pack_img,
        "img_pos": pos,
        "img_tokens": images.n_tokens[pick],
        "img_patches": images.n_patches[pick],
        "img_row": images.row[pick],
    }


def vision_record(
    key: dict[str, Any], plan: VisionPlan, companions: dict[str, np.ndarray], budget: int | None
) -> dict[str, Any]:
    """The metadata line's `vision` record: the processor's identity (the loader rebuilds it) and the counts."""
    po = companions["pack_img"]
    patches = np.asarray(companions["img_patches"], np.int64)
    cum = np.concatenate([np.zeros(1, np.int64), np.cumsum(patches)])
    per_pack = cum[po[1:]] - cum[po[:-1]]
    return {
        **key,
        "budget": budget,
        "n_images": int(patches.size),
        "n_image_tokens": int(np.asarray(companions["img_tokens"], np.int64).sum()),
        "n_patches": int(patches.sum()),
        "max_pack_patches": int(per_pack.max()) if per_pack.size else 0,
        "max_pack_images": int(np.diff(po).max()) if per_pack.size else 0,
        "n_dropped_images": plan.segments.n_dropped_images,
        "lower_bound_packs": plan.lower_bound,
    }
