"""Documents with images -> segments whose image spans are never cut.

An image occupies `n_tokens` image tokens at `offset` in its document; the token before and the token
after (the family's opening and closing markers, `<|vision_start|>` / `<|vision_end|>`,
`<start_of_image>` / `<end_of_image>`) belong to it too, so a cut never separates an image from its
markers. A document no longer than the usable capacity (and, with a vision budget, of at most
`budget` patches) is one segment. A longer one follows `--overlong`: `split` cuts it greedily into
fragments of at most `cap` tokens and `budget` patches, a cut that would fall inside an image moving
back to the image's start; `truncate` keeps the first such fragment; `drop` drops it; `error` refuses.
An image that alone exceeds the capacity or the budget cannot be placed: it is refused under
`error`, `split` and `truncate` (naming the document, `--overlong drop` and the flags that fix it),
and its document is dropped under `drop`.

One compiled pass over documents and images (two: count, then fill), never a loop over tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from packtool.choices import Overlong
from packtool.core.packing.segments import Segments, usable_capacity
from packtool.errors import ConfigError

#: why a document could not be cut (the `_cut` pass's verdicts)
_OK, _IMAGE_TOO_LONG, _IMAGE_OVER_BUDGET = 0, 1, 2


@dataclass(frozen=True)
class ImageSpans:
    """Image occurrences in document then offset order; `doc` numbers the documents being segmented."""

    doc: np.ndarray  # int64 document index (into the `starts`/`lengths` given to `build_vision_segments`)
    offset: np.ndarray  # int64 token offset of the first image token in its document
    n_tokens: np.ndarray  # int64
    n_patches: np.ndarray  # int64
    row: np.ndarray  # int64 the image's row in its store(s) (what the pack store records)


@dataclass(frozen=True)
class VisionSegments:
    """`Segments` plus what each segment holds of images: its images are `images[first : first + count]`."""

    segments: Segments
    at: np.ndarray  # int64 token offset of each segment's first token in its document
    patches: np.ndarray  # int64 vision patches per segment
    first: np.ndarray  # int64 index of the segment's first image in the ImageSpans arrays
    count: np.ndarray  # int64 images per segment
    n_dropped_images: int


@njit(cache=True)
def _fragment_end(
    pos: int,
    length: int,
    i: int,
    hi: int,
    off: np.ndarray,
    ntok: np.ndarray,
    patches: np.ndarray,
    cap: int,
    budget: int,
) -> tuple[int, int, int]:
    """Where the fragment starting at `pos` ends (images from `i`): (end, images in it, their patches).

    A cut c is forbidden where it would separate an image from its tokens or markers (off <= c <= off + n)
    unless it is the document's end; the end moves back to the image's opening marker. `end <= pos`: none fits."""
    end = min(pos + cap, length)
    while end > pos:
        moved = True
        while moved and end > pos and end < length:
            moved = False
            for j in range(i, hi):
                if off[j] <= end <= off[j] + ntok[j]:
                    end = off[j] - 1
                    moved = True
                    break
        j, used = i, 0
        while j < hi and off[j] < end:
            used += patches[j]
            j += 1
        if used <= budget:
            return end, j - i, used
        k, used = i, 0
        while used + patches[k] <= budget:  # the first image over the budget starts the next fragment
            used += patches[k]
            k += 1
        end = off[k] - 1
    return end, 0, 0


@njit(cache=True)
def _cut(
    lengths: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    off: np.ndarray,
    ntok: np.ndarray,
    patches: np.ndarray,
    cap: int,
    budget: int,
    keep_rest: bool,
    keep_first: bool,
    fill: bool,
    out_doc: np.ndarray,
    out_at: np.ndarray,
    out_real: np.ndarray,
    out_first: np.ndarray,
    out_count: np.ndarray,
    out_patches: np.ndarray,
) -> tuple[int, int, int, int]:
    """Fragments of every document (filled into `out_*` when `fill`); returns (fragments, verdict, doc, image).

    `keep_rest`: every fragment (split); else only the first (`keep_first`: truncate) or none (drop).
    A verdict other than _OK names the first document that cannot be cut and the image that blocks it."""
    k = 0
    for d in range(lengths.size):
        length = lengths[d]
        if length == 0:
            continue
        total = 0
        for i in range(lo[d], hi[d]):
            total += patches[i]
        if length <= cap and total <= budget:
            if fill:
                out_doc[k], out_at[k], out_real[k] = d, 0, length
                out_first[k], out_count[k], out_patches[k] = lo[d], hi[d] - lo[d], total
            k += 1
            continue
        if not keep_rest and not keep_first:
            continue  # drop
        pos, i = 0, lo[d]
        while pos < length:
            end, count, used = _fragment_end(pos, length, i, hi[d], off, ntok, patches, cap, budget)
            if end <= pos:
                return k, _IMAGE_OVER_BUDGET if patches[i] > budget else _IMAGE_TOO_LONG, d, i
            if fill:
                out_doc[k], out_at[k], out_real[k] = d, pos, end - pos
                out_first[k], out_count[k], out_patches[k] = i, count, used
            k += 1
            pos, i = end, i + count
            if not keep_rest:
                break
    return k, _OK, -1, -1


def build_vision_segments(
    starts: np.ndarray,
    lengths: np.ndarray,
    images: ImageSpans,
    size: int,
    overlong: Overlong | str = Overlong.SPLIT,
    pad_multiple: int = 1,
    budget: int | None = None,
) -> VisionSegments:
    """`build_segments` for documents holding images (`images.doc` indexes `starts`/`lengths`)."""
    policy = Overlong(overlong)
    cap = usable_capacity(size, pad_multiple)
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    docs = np.arange(lengths.size, dtype=np.int64)
    lo = np.searchsorted(images.doc, docs, side="left").astype(np.int64)
    hi = np.searchsorted(images.doc, docs, side="right").astype(np.int64)
    cum = np.concatenate([np.zeros(1, np.int64), np.cumsum(images.n_patches, dtype=np.int64)])
    per_doc = cum[hi] - cum[lo]
    bound = np.iinfo(np.int64).max if budget is None else int(budget)
    long_mask = (lengths > cap) | (per_doc > bound)
    n_overlong = int(np.count_nonzero(long_mask))
    if n_overlong and policy is Overlong.ERROR:
        d = int(np.flatnonzero(long_mask)[0])
        what = f"{int(lengths[d])} tokens" if lengths[d] > cap else f"{int(per_doc[d])} vision patches"
        limit = f"the pack size {size}" if lengths[d] > cap else f"--vision-budget {budget}"
        raise ConfigError(
            f"document {d} has {what}, more than {limit} ({n_overlong} over-long documents in all), token store, "
            "use --overlong split|truncate|drop, a larger --size or a larger --vision-budget"
        )
    keep_rest, keep_first = policy is Overlong.SPLIT, policy is Overlong.TRUNCATE
    args = (lengths, lo, hi, images.offset, images.n_tokens, images.n_patches, cap, bound, keep_rest, keep_first)
    empty = np.zeros(0, np.int64)
    n, verdict, d, i = _cut(*args, False, empty, empty, empty, empty, empty, empty)
    if verdict != _OK:
        _refuse(verdict, d, i, images, size, budget)
    out = [np.empty(n, np.int64) for _ in range(6)]
    _cut(*args, True, *out)
    seg_doc, at, real, first, count, patches = out
    kept_images = int(count.sum())
    pad = (-real) % pad_multiple
    segments = Segments(
        doc=seg_doc,
        src=starts[seg_doc] + at,
        real=real,
        pad=pad.astype(np.int64),
        n_overlong=n_overlong,
        n_empty=int(np.count_nonzero(lengths == 0)),
        n_dropped_tokens=int(lengths.sum() - real.sum()),
    )
    return VisionSegments(segments, at, patches, first, count, int(images.doc.size) - kept_images)


def _refuse(verdict: int, d: int, i: int, images: ImageSpans, size: int, budget: int | None) -> None:
    if verdict == _IMAGE_OVER_BUDGET:
        raise ConfigError(
            f"document {d} holds an image of {int(images.n_patches[i])} vision patches, more than --vision-budget "
            f"{budget}: no pack can hold it, token store, pass a larger --vision-budget or --overlong drop"
        )
    raise ConfigError(
        f"document {d} holds an image of {int(images.n_tokens[i])} tokens (with its markers) that does not fit "
        f"a pack of {size}: an image is never cut, token store, pass a larger --size or --overlong drop"
    )
