"""Image statistics: what a vision token store holds, and how a vision pack split spreads its images.

A token store: images (unique), image tokens and their share of all tokens, patches, images and patches
per document holding images. A pack split: image tokens, images per pack and patches per pack (mean,
p50, p99, max; the budget when one was set), read from the split's image CSR alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.formats.pack_checks import vision_of
from packtool.formats.pack_store import PackSplit
from packtool.formats.token_store import TokenStore


def _spread(values: np.ndarray) -> dict[str, float]:
    if not values.size:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    p50, p99 = np.percentile(values, [50, 99])
    return {"mean": float(values.mean()), "p50": float(p50), "p99": float(p99), "max": float(values.max())}


def token_vision_stats(store: TokenStore) -> dict[str, Any] | None:
    """Images of a token store (None for a text-only store)."""
    table = store.media
    if table is None:
        return None
    ntok = int(np.asarray(table.n_tokens, np.int64).sum())
    docs, per_doc = np.unique(table.doc, return_counts=True)
    patches = np.bincount(np.searchsorted(docs, table.doc), weights=np.asarray(table.n_patches), minlength=docs.size)
    return {
        "family": table.vision.get("family"),
        "n_images": len(table),
        "n_unique": int(table.index.size),
        "n_image_tokens": ntok,
        "image_token_share": ntok / store.n_tokens if store.n_tokens else 0.0,
        "n_patches": int(np.asarray(table.n_patches).sum()),
        "documents_with_images": int(docs.size),
        "images_per_document": _spread(per_doc.astype(np.float64)),
        "patches_per_document": _spread(patches),
    }


def pack_vision_stats(ps: PackSplit) -> dict[str, Any] | None:
    """Images per pack and patches per pack of a vision split (None for a text-only split)."""
    vision = vision_of(ps.metadata, ps.directory)
    if vision is None or ps.images is None:
        return None
    po = np.asarray(ps.images["pack_img"], np.int64)
    pack = np.repeat(np.arange(ps.n_packs), np.diff(po))
    patches = np.bincount(pack, weights=np.asarray(ps.images["img_patches"]), minlength=ps.n_packs)
    ntok = int(np.asarray(ps.images["img_tokens"], np.int64).sum())
    real = int(ps.metadata.get("n_tokens", 0))
    return {
        "family": vision.get("family"),
        "budget": vision.get("budget"),
        "n_images": int(po[-1]) if po.size else 0,
        "n_image_tokens": ntok,
        "image_token_share": ntok / real if real else 0.0,
        "n_dropped_images": vision.get("n_dropped_images", 0),
        "images_per_pack": _spread(np.diff(po).astype(np.float64)),
        "patches_per_pack": _spread(patches),
    }
