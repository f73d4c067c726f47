"""Records with images in a tokenize run: the processor's rules applied in the chunk task, image rows found in ids.

A record with images (`core.encoding.shapes.images`: canonical content parts + ordered `ImageRef`s) becomes a
`VisionText` in the chunk task: each reference resolved to its encoded bytes (`inputs/media.py`), each image
measured by the model folder's processor (`packtool.vision`: decode + resize rules: token count, grid,
patches), the conversation rendered by the chat template (which writes the family's placeholder once per
`{"type": "image"}` part) and the placeholders expanded as the processor expands them, target spans split
around them. After encoding, `image_rows` finds each image's run of image tokens in the document's ids
(vectorised), checks it against the measured count, and clears those tokens' loss: an image token is never a
target. The rows travel in the chunk's result to the coordinator, which writes them with the store's
`MediaWriter` in document order (`pipeline.py`), so workers, shards, resume and Ray give the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from packtool.core.encoding.encode import Spans
from packtool.errors import InputError

#: one image occurrence, relative to its chunk: (document index in the chunk, token offset in the document,
#: n_tokens, grid (t, h, w), n_patches, encoded bytes)
ImageRow = tuple[int, int, int, tuple[int, int, int], int, bytes]


class VisionText(NamedTuple):
    """A record with images, ready to encode: text and spans as every record (`got[0]`, `got[1]`), plus its
    images' encoded bytes and what the processor measured of each (`ImageInfo`), in order."""

    text: str
    spans: Spans | None
    images: tuple[bytes, ...]
    infos: tuple[Any, ...]


@lru_cache(maxsize=4)
def _processor(config: str) -> Any:
    from packtool.vision import VisionProcessor

    return VisionProcessor.from_config(json.loads(config))


def processor_of(vision: dict[str, Any]) -> Any:
    """The run's `VisionProcessor`, rebuilt once per process from the settings' `vision` (its config)."""
    return _processor(json.dumps(vision, sort_keys=True))


def measure(vision: dict[str, Any], images: Sequence[bytes], labels: Sequence[str]) -> tuple[Any, ...]:
    """What the processor measures of each image (decoding it): InputError naming the image when it cannot."""
    processor = processor_of(vision)
    return tuple(processor.measure(data, label) for data, label in zip(images, labels, strict=True))


def expand(vision: dict[str, Any], text: str, spans: Spans | None, infos: Sequence[Any]) -> tuple[str, Spans | None]:
    """The rendered text with each placeholder expanded (InputError when they are miscounted, or when the text
    holds the image token itself: its ids would be image tokens without an image)."""
    processor = processor_of(vision)
    no_image_token(vision, text, processor.placeholder)
    return processor.expand(text, spans, list(infos))  # type: ignore[no-any-return]


def no_image_token(vision: dict[str, Any], text: str, allowed: str | None = None) -> None:
    """InputError when a rendered text holds the family's image token as text (unless it is the placeholder,
    which `expand` counts): a text-only record in an image run, or a literal `<image_soft_token>`."""
    token = vision.get("image_token")
    if isinstance(token, str) and token and token != allowed and token in text:
        raise InputError(
            f"the rendered text holds the image token {token!r} as text, which would become image tokens without "
            "an image; remove it from the record (images go in image parts or <image> placeholders)"
        )


def image_rows(
    vision: dict[str, Any],
    ids: np.ndarray,
    lengths: np.ndarray,
    loss: np.ndarray | None,
    docs: Sequence[VisionText | None],
    first_doc: int,
) -> list[ImageRow]:
    """The image rows of a batch's documents (`docs[k]` None: a text-only document), each image's first token
    found in the ids; their tokens' loss set to 0 in place. InputError when a document's image tokens are not
    the measured runs (a literal image token in the text, a template that writes its own)."""
    token = processor_of(vision).image_token_id
    ends = np.cumsum(lengths)
    starts = ends - lengths
    rows: list[ImageRow] = []
    for k, doc in enumerate(docs):
        if doc is None:
            continue
        a, b = int(starts[k]), int(ends[k])
        where = np.flatnonzero(ids[a:b] == token)
        counts = np.fromiter((info.n_tokens for info in doc.infos), np.int64, len(doc.infos))
        firsts = np.cumsum(counts) - counts
        if where.size != int(counts.sum()) or (
            where.size and not np.array_equal(where - np.repeat(where[firsts], counts), _ramps(counts))
        ):
            raise InputError(
                f"images miscounted: the record's {len(doc.infos)} images measure {int(counts.sum())} image tokens in "
                f"runs of {counts.tolist()[:8]}, but its ids hold {where.size} image token(s) (id {token}) otherwise "
                "placed (a literal image token in the text?)"
            )
        if loss is not None and where.size:
            loss[a + where] = 0
        for info, first, data in zip(doc.infos, firsts, doc.images, strict=True):
            grid = tuple(int(g) for g in info.grid)
            rows.append((first_doc + k, int(where[first]), int(info.n_tokens), grid, int(info.n_patches), data))  # type: ignore[arg-type]
    return rows


def _ramps(counts: np.ndarray) -> np.ndarray:
    """0..c-1 for each count, concatenated."""
    total = int(counts.sum())
    return np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
