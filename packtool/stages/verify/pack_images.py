"""Verify the images of a vision pack split: every image whole inside one segment of its pack, its span
exactly the image token, no image token without its image, the budget kept; with the source token
stores, every image of every packed document in the pack of its document, at its place, and nothing else.

Vectorised over images and packs; the first failure raises a FormatError naming the file and the fix.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.errors import FormatError
from packtool.formats.media import VISION, runs
from packtool.formats.pack_checks import vision_of
from packtool.formats.pack_store import PackSplit
from packtool.formats.store_set import StoreSet
from packtool.stages.pack.vision import image_spans
from packtool.stages.verify.media import BLOCK_IMAGES
from packtool.stages.verify.tokens import BLOCK_TOKENS

_REPACK = "re-run `packtool pack`"
#: positions are below 2**27 (the largest pack size is 2**26): (document, offset) as one sortable int64
_SHIFT = 27


def _fail(ps: PackSplit, role: str, what: str) -> FormatError:
    return FormatError(f"{what}, {ps.directory / ps.file_name(role)}, {_REPACK}")


def verify_pack_images(ps: PackSplit, lens: np.ndarray, dst: np.ndarray, store: StoreSet | None) -> str:
    """'' for a text-only split; else what was checked (one clause of the summary line)."""
    vision = vision_of(ps.metadata, ps.directory)
    if vision is None or ps.images is None:
        return ""
    arr = {k: np.asarray(v, np.int64) for k, v in ps.images.items()}
    po, pos, ntok, patches = arr["pack_img"], arr["img_pos"], arr["img_tokens"], arr["img_patches"]
    n, size, tid = int(pos.size), ps.size, int(vision["image_token_id"])
    pack = np.repeat(np.arange(ps.n_packs, dtype=np.int64), np.diff(po))
    # every span inside one segment of its pack: the segment starting at or before it ends at or after it
    starts = np.asarray(dst, np.int64)
    flat = pack * size + pos
    seg = np.searchsorted(starts, flat, side="right") - 1
    bad = (seg < 0) | (flat + ntok > starts[np.maximum(seg, 0)] + np.asarray(lens, np.int64)[np.maximum(seg, 0)])
    if n and bad.any():
        k = int(np.argmax(bad))
        raise _fail(
            ps, "img_pos", f"image {k} of pack {int(pack[k])} (position {int(pos[k])}) is not inside one segment"
        )
    rows = np.asarray(ps.tokens).reshape(-1)
    for a in range(0, n, BLOCK_IMAGES):  # bounded memory: the spans of a block of images at a time
        if bool(np.any(rows[runs(flat[a : a + BLOCK_IMAGES], ntok[a : a + BLOCK_IMAGES])] != tid)):
            raise _fail(ps, "img_pos", f"an image span of the packs is not all image tokens ({tid})")
    per_pack = np.bincount(pack, weights=ntok, minlength=ps.n_packs).astype(np.int64)
    step = max(1, BLOCK_TOKENS // size)
    held = np.concatenate(
        [np.count_nonzero(np.asarray(ps.tokens[a : a + step]) == tid, axis=1) for a in range(0, ps.n_packs, step)]
        or [np.zeros(0, np.int64)]
    ).astype(np.int64)
    if np.any(held != per_pack):
        p = int(np.argmax(held != per_pack))
        raise _fail(ps, "img_tokens", f"pack {p} holds {held[p]} image tokens but its images account for {per_pack[p]}")
    pack_patches = np.bincount(pack, weights=patches, minlength=ps.n_packs).astype(np.int64)
    budget = vision.get("budget")
    if isinstance(budget, int) and pack_patches.size and int(pack_patches.max()) > budget:
        p = int(np.argmax(pack_patches > budget))
        raise _fail(
            ps, "img_patches", f"pack {p} holds {pack_patches[p]} vision patches, over --vision-budget {budget}"
        )
    for key, got in (("n_images", n), ("n_image_tokens", int(ntok.sum())), ("n_patches", int(patches.sum()))):
        if vision.get(key) != got:
            raise _fail(ps, "pack_img", f"metadata vision.{key} is {vision.get(key)!r} but the image arrays give {got}")
    line = f"{n} images whole in their packs ({int(ntok.sum())} image tokens, <= {int(pack_patches.max(initial=0))} patches a pack)"
    if store is not None:
        _check_sources(ps, vision, arr, lens, dst, store)
        line += ", each where its document is"
    return line


def _check_sources(
    ps: PackSplit,
    vision: dict[str, Any],
    arr: dict[str, np.ndarray],
    lens: np.ndarray,
    dst: np.ndarray,
    store: StoreSet,
) -> None:
    """The image rows each packed segment must hold (its document's images inside its tokens), in order."""
    ident = {k: v for k, v in vision.items() if k in ("family", "processor", "image_token_id")}
    for s in store.stores:
        key = s.manifest.get(VISION)
        if key is not None and {k: key.get(k) for k in ident} != ident:
            raise _fail(ps, "pack_img", f"the packs were made with another image processor than {s.path}'s")
    images = image_spans(store, None)  # every image of the sources, global documents, numbered over the set
    keys = (images.doc << _SHIFT) | images.offset
    seg_doc = np.asarray(ps.seg_doc, np.int64)
    at = np.asarray(ps.seg_src, np.int64) - store.starts[seg_doc]  # the segment's first token in its document
    real = np.asarray(lens, np.int64) - np.asarray(ps.seg_pad, np.int64)
    lo = np.searchsorted(keys, (seg_doc << _SHIFT) | at, side="left")
    hi = np.searchsorted(keys, (seg_doc << _SHIFT) | (at + real), side="left")
    want = runs(lo, hi - lo)
    seg_of = np.repeat(np.arange(seg_doc.size, dtype=np.int64), hi - lo)
    cut = images.offset[want] + images.n_tokens[want] > (at + real)[seg_of]
    if cut.any():
        k = int(np.argmax(cut))
        raise _fail(
            ps,
            "img_pos",
            f"segment {int(seg_of[k])} cuts image row {int(images.row[want[k]])} of document {int(seg_doc[seg_of[k]])}",
        )
    want_pos = (np.asarray(dst, np.int64) % ps.size)[seg_of] + images.offset[want] - at[seg_of]
    got_rows, got_pos = arr["img_row"], arr["img_pos"]
    if (
        want.size != got_rows.size
        or not np.array_equal(images.row[want], got_rows)
        or not np.array_equal(want_pos, got_pos)
    ):
        same = min(want.size, got_rows.size)
        diff = (images.row[want[:same]] != got_rows[:same]) | (want_pos[:same] != got_pos[:same])
        k = int(np.argmax(diff)) if diff.any() else same
        raise _fail(
            ps,
            "img_row",
            f"the packs hold {got_rows.size} images but their documents hold {want.size} inside the packed tokens "
            f"(first difference at image {k}: an image missing, extra, out of its document's pack or misplaced)",
        )
    tokens = np.asarray(images.n_tokens[want])
    if not np.array_equal(tokens, arr["img_tokens"]) or not np.array_equal(images.n_patches[want], arr["img_patches"]):
        raise _fail(ps, "img_tokens", "image token or patch counts differ from the source token stores' images.rows")


def check_vision_coverage(ps: PackSplit, real: np.ndarray, stores: StoreSet, mult: np.ndarray | None) -> None:
    """Every source document `mult[d]` times as fragments that tile what `--overlong` keeps of it.

    A vision split cuts only at text, so fragments are not at multiples of N: each distinct fragment must be
    packed `mult[d]` times, the distinct fragments of a document must run from its token 0 on without gap or
    overlap, to its end (split), as one fragment of at most N (truncate), or whole or not at all (drop:
    only a document over N tokens or over the budget is left out). Images are checked whole elsewhere."""
    meta = ps.metadata
    doc, src = np.asarray(ps.seg_doc, np.int64), np.asarray(ps.seg_src, np.int64)
    n_docs, lengths = stores.n_documents, stores.lengths
    mult = np.ones(n_docs, np.int64) if mult is None else np.asarray(mult, np.int64)
    if int(meta.get("n_documents", -1)) != int(mult.sum()) or (doc.size and (doc.min() < 0 or doc.max() >= n_docs)):
        raise _fail(
            ps, "seg_doc", f"segments name documents outside the sources' {n_docs} (or metadata n_documents is off)"
        )
    off = src - stores.starts[doc]
    order = np.lexsort((off, doc))
    d, o, r = doc[order], off[order], np.asarray(real, np.int64)[order]
    new = np.ones(d.size, bool)
    new[1:] = (d[1:] != d[:-1]) | (o[1:] != o[:-1])
    first = np.flatnonzero(new)
    count = np.diff(np.append(first, d.size))
    if np.any(count != mult[d[first]]):
        k = int(np.argmax(count != mult[d[first]]))
        raise _fail(
            ps,
            "seg_src",
            f"document {int(d[first[k]])}: its fragment at token {int(o[first[k]])} is packed {int(count[k])} times, expected {int(mult[d[first[k]]])}",
        )
    d, o, r = d[first], o[first], r[first]
    head = np.ones(d.size, bool)
    head[1:] = d[1:] != d[:-1]
    tail = np.ones(d.size, bool)
    tail[:-1] = d[1:] != d[:-1]
    policy = str((meta.get("overlong") or {}).get("policy", "split"))
    bad = (head & (o != 0)) | (~head & (o != np.roll(o + r, 1))) | (o + r > lengths[d])
    if policy in ("split", "drop"):
        bad |= tail & (o + r != lengths[d])
    if policy != "split":  # drop: whole or not at all; truncate: one fragment of at most N from the start
        bad |= ~(head & tail) | (r > ps.size)
    if bad.any():
        k = int(np.argmax(bad))
        raise _fail(
            ps,
            "seg_src",
            f"document {int(d[k])}: fragment {int(o[k])}..{int(o[k] + r[k])} of its {int(lengths[d[k]])} tokens leaves a gap, overlaps or runs past what --overlong {policy} keeps",
        )
    packed = np.zeros(n_docs, bool)
    packed[d] = True
    missing = ~packed & (mult > 0) & (lengths > 0)
    if policy != "drop" and missing.any():
        raise _fail(ps, "seg_doc", f"document {int(np.argmax(missing))} is not packed (missing document)")
    if policy == "drop" and missing.any():
        images = image_spans(stores, None)
        cum = np.concatenate([np.zeros(1, np.int64), np.cumsum(images.n_patches)])
        docs = np.arange(n_docs)
        patches = cum[np.searchsorted(images.doc, docs, "right")] - cum[np.searchsorted(images.doc, docs, "left")]
        budget = (meta.get("vision") or {}).get("budget")
        over = (lengths > ps.size) | (patches > (budget if isinstance(budget, int) else np.iinfo(np.int64).max))
        if np.any(missing & ~over):
            raise _fail(
                ps,
                "seg_doc",
                f"document {int(np.argmax(missing & ~over))} fits a pack but is not packed (missing document)",
            )
