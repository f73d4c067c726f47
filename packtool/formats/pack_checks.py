"""Checks of a pack split's numbers and the companions of a vision pack store (below `pack_store`, which uses them).

A vision split (its metadata line has a `vision` record, copied from the token store's manifest) adds
one CSR over its images: `pack_img` `[n_packs + 1]` points into per-image arrays in pack and row order,
`img_pos` (the token position of the image's first image token in its pack row), `img_tokens`,
`img_patches`, and `img_row`, the image's row in its source token stores' `images.rows` (sources in the
metadata's order, rows numbered on: the bytes, grids and patches are read there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.errors import FormatError

#: companions of a vision pack store only (a `vision` key in its metadata line)
VISION_COMPANIONS: dict[str, np.dtype] = {
    "pack_img": np.dtype("<i8"),  # [n_packs + 1] CSR row pointer into the image arrays below
    "img_pos": np.dtype("<i4"),  # [n_images] position of the image's first image token in its pack row
    "img_tokens": np.dtype("<i4"),  # [n_images] its image tokens
    "img_patches": np.dtype("<i8"),  # [n_images] its vision-encoder patches
    "img_row": np.dtype("<i8"),  # [n_images] its row in the sources' images.rows (sources in order)
}
_FIX = "re-run `packtool pack`"


def check_vision_arrays(arrays: dict[str, np.ndarray], n_packs: int, size: int, where: str) -> None:
    """The vision CSR is consistent: pointers over every image once, every span inside its pack row."""
    po = arrays["pack_img"]
    n = int(arrays["img_pos"].size)
    if po.size != n_packs + 1 or (po.size and (int(po[0]) != 0 or int(po[-1]) != n)) or bool(np.any(np.diff(po) < 0)):
        raise FormatError(f"pack_img is inconsistent with {n_packs} packs and {n} images, {where}, {_FIX}")
    for name in ("img_tokens", "img_patches", "img_row"):
        if arrays[name].size != n:
            raise FormatError(f"{name} has {arrays[name].size} entries, expected {n}, {where}, {_FIX}")
    pos, ntok = np.asarray(arrays["img_pos"], np.int64), np.asarray(arrays["img_tokens"], np.int64)
    if n and (int(pos.min()) < 0 or int(ntok.min()) < 1 or int((pos + ntok).max()) > size):
        raise FormatError(f"an image span lies outside its pack row of {size} tokens, {where}, {_FIX}")


def vision_of(meta: dict[str, Any], where: object = "") -> dict[str, Any] | None:
    """The `vision` record of a metadata line, None for a text-only split."""
    vision = meta.get("vision")
    if vision is None:
        return None
    if not isinstance(vision, dict) or not isinstance(vision.get("image_token_id"), int):
        raise FormatError(f"metadata vision {str(vision)[:60]} has no image_token_id, {where}, {_FIX}")
    return vision


def check_metadata_numbers(
    meta: dict[str, Any], size: int, n_packs: int, n_segments: int, dtype: np.dtype, where: str
) -> None:
    """The cheap lies a metadata line can tell (no hashes): size, row and segment counts, pad id range.

    `pad_id` must be a token id: below the tokenizer's `vocab_size` when the line records it, and
    representable in the token dtype always.
    """
    fix = "re-run `packtool pack`"
    for key, want in (("pack_size", size), ("n_packs", n_packs), ("n_segments", n_segments)):
        got = meta.get(key)
        if key == "n_segments" and got is None:
            continue  # optional in hand-written version-1 lines
        if isinstance(got, bool) or not isinstance(got, int) or got != want:
            raise FormatError(f"metadata {key} is {got!r} but the files give {want}, {where}, {fix}")
    bound = int(np.iinfo(dtype).max) + 1
    vocab = meta.get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
        bound = min(bound, vocab)
    pad_id = meta.get("pad_id")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < bound:
        raise FormatError(f"metadata pad_id {pad_id!r} is not a token id (expected 0..{bound - 1}), {where}, {fix}")
