"""The images of a vision pack store's items: pixels, grids, M-RoPE positions, token types (docs/VISION.md).

A vision split's metadata carries the processor's config (`VisionProcessor.from_config` rebuilds it) and
an image CSR (`formats.pack_checks`): for pack p, images `pack_img[p]:pack_img[p + 1]` in row order, each
at `img_pos` in the row, its bytes and grid at `img_row` of its source token stores' `images.rows`. The
bytes are decoded and run through the processor here, in the DataLoader worker that builds the batch.

Per pack:
- `pixel_values`: the processor's rows for the pack's images, in order (its `pixel_rows` of that list);
- `image_grid_thw` (int64 [k, 3]) where the family uses grids; the grid each row recorded is checked;
- `mrope` (int64 [3, N]) for M-RoPE families: each segment's `rope_positions`, the segment alone (what
  `get_rope_index` gives that document alone); padding 1, as transformers pads;
- `token_type_ids` (int64 [N]) for families with token types (Gemma 3: 1 on image tokens).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from packtool.errors import ConfigError, FormatError
from packtool.formats.files import sha256_bytes
from packtool.formats.media import MediaTable
from packtool.formats.pack_checks import vision_of
from packtool.formats.pack_store import PackSplit, metadata_sources

if TYPE_CHECKING:
    from packtool.vision import VisionProcessor

#: the keys a vision item adds (besides `position_ids` becoming [4, N] for M-RoPE families)
VISION_KEYS = ("pixel_values", "image_grid_thw", "token_type_ids")
#: M-RoPE positions of padding tokens (transformers' get_rope_index fills masked positions with 1)
PAD_POSITION = 1


def _processor(config: dict[str, Any]) -> VisionProcessor:
    from packtool.vision import VisionProcessor  # PIL: imported only where a vision store is read

    return VisionProcessor.from_config(config)


class VisionViews:
    """A vision split's processor, image arrays and source media tables (built once per process)."""

    def __init__(self, store: PackSplit, sources: Sequence[str | os.PathLike[str]] | None = None) -> None:
        vision = vision_of(store.metadata, store.directory)
        if vision is None or store.images is None:
            raise FormatError(f"{store.split}_{store.size} is not a vision split, {store.directory}, this is a bug")
        self.processor = _processor(vision["processor"])
        self.pack_img = np.asarray(store.images["pack_img"], np.int64)
        self.pack_offsets = np.asarray(store.pack_offsets, np.int64)  # the packs' real segments (no tail padding)
        self.pos = np.asarray(store.images["img_pos"], np.int64)
        self.ntok = np.asarray(store.images["img_tokens"], np.int64)
        self.row = np.asarray(store.images["img_row"], np.int64)
        self.tables = _tables(store, sources)
        counts = [0 if t is None else len(t) for t in self.tables]
        self.row_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.row.size and int(self.row.max()) >= int(self.row_offsets[-1]):
            raise FormatError(
                f"the packs name image row {int(self.row.max())} but their sources hold {int(self.row_offsets[-1])}, "
                f"{store.directory / store.file_name('img_row')}, re-run `packtool pack`"
            )

    def _image(self, k: int) -> tuple[MediaTable, int]:
        s = int(np.searchsorted(self.row_offsets, self.row[k], side="right")) - 1
        table = self.tables[s]
        assert table is not None  # rows of text-only sources are never named (checked above)
        return table, int(self.row[k] - self.row_offsets[s])

    def batch(self, idx: np.ndarray, rows: np.ndarray, segments: tuple[np.ndarray, ...]) -> dict[str, Any]:
        """The vision keys of packs `idx` whose rows are `rows[0]` [B, N] and segments `segments` (`segment_arrays`
        of `build_batch`): ONE `pixel_rows` call over the batch's images in order (each pack's rows a slice of it,
        as the processor treats every image alone), `pixel_bounds` / `image_bounds` [B + 1] per pack."""
        spans = [(int(self.pack_img[p]), int(self.pack_img[p + 1])) for p in idx.tolist()]
        located = [self._image(k) for a, b in spans for k in range(a, b)]
        pixels, grids = self.processor.pixel_rows([table.data(i) for table, i in located])
        image_bounds = np.concatenate([[0], np.cumsum([b - a for a, b in spans])]).astype(np.int64)
        out: dict[str, Any] = {"pixel_values": pixels, "image_bounds": image_bounds}
        got = np.asarray(grids if grids is not None else np.zeros((0, 3)), np.int64).reshape(-1, 3)
        if self.processor.uses_grid:
            want = np.asarray([table.grid[i] for table, i in located], np.int64).reshape(-1, 3)
            if not np.array_equal(want, got):
                raise FormatError(
                    f"the processor gives grids {got.tolist()[:4]} for the images of packs {idx.tolist()[:4]} but the "
                    f"store recorded {want.tolist()[:4]} (another processor version?), {located[0][0].path}, "
                    "re-run `packtool tokenize`"
                )
            out["image_grid_thw"] = got
            per_image = got.prod(axis=1)
        else:
            per_image = np.ones(len(located), np.int64)
        if int(per_image.sum()) != int(pixels.shape[0]):
            raise FormatError(
                f"the {self.processor.family} processor gave {pixels.shape[0]} pixel rows for {len(located)} images "
                f"({int(per_image.sum())} expected), this is a bug"
            )
        cum = np.concatenate([[0], np.cumsum(per_image)]).astype(np.int64)
        out["pixel_bounds"] = cum[image_bounds]
        lens, real, counts = segments[0], segments[1], segments[2]
        bounds = np.concatenate([[0], np.cumsum(counts)])
        if self.processor.mrope:
            out["mrope"] = np.full((3, *rows.shape[1:]), PAD_POSITION, np.int64)
            for r, p in enumerate(idx.tolist()):  # per pack, then per segment: never per token
                a, b = spans[r]
                n = int(self.pack_offsets[p + 1] - self.pack_offsets[p])  # entries after these are tail padding
                seg = slice(int(bounds[r]), int(bounds[r]) + n)
                out["mrope"][:, r] = self._mrope(
                    rows[0, r], lens[seg], real[seg], self.pos[a:b], got[image_bounds[r] : image_bounds[r + 1]]
                )
        if self.processor.token_type_ids:  # over the whole rows: padding is never the image token
            out["token_type_ids"] = np.asarray(self.processor.token_types(rows[0]), np.int64).reshape(rows.shape[1:])
        return out

    def _mrope(
        self, ids: np.ndarray, lens: np.ndarray, real: np.ndarray, pos: np.ndarray, grids: np.ndarray
    ) -> np.ndarray:
        """[3, N]: each segment's `rope_positions` alone (its images' grids), padding PAD_POSITION."""
        out = np.full((3, ids.size), PAD_POSITION, np.int64)
        ends = np.cumsum(lens)
        starts = ends - lens
        first = np.searchsorted(pos, starts, side="left")
        last = np.searchsorted(pos, starts + real, side="left")
        for s in range(lens.size):  # per segment, never per token
            a, n = int(starts[s]), int(real[s])
            if n == 0:
                continue
            rope = self.processor.rope_positions(ids[a : a + n], grids[first[s] : last[s]])
            if rope is None:
                raise FormatError(f"the {self.processor.family} processor gives no M-RoPE positions, this is a bug")
            out[:, a : a + n] = rope
        return out


def _tables(store: PackSplit, sources: Sequence[str | os.PathLike[str]] | None) -> list[MediaTable | None]:
    """The media tables of the split's sources (metadata order), each checked to be the store it was packed from."""
    recs = metadata_sources(store.metadata)
    paths = [Path(str(r.get("path"))) for r in recs] if sources is None else [Path(p) for p in sources]
    if len(paths) != len(recs):
        raise ConfigError(
            f"{len(paths)} sources given for a split packed from {len(recs)} token stores, PackedDataset(sources=...), "
            "pass one token store per source, in the order `packtool stats` lists them"
        )
    tables = []
    for rec, path in zip(recs, paths, strict=True):
        manifest = path / "manifest.json"
        try:
            sha = sha256_bytes(manifest.read_bytes())
        except OSError as exc:
            raise FormatError(
                f"the images of this vision pack store live in its source token store, which cannot be read "
                f"({exc.strerror or exc}), {manifest}, pass PackedDataset(sources=[...]) where the token stores are now"
            ) from None
        if sha != rec.get("manifest_sha256"):
            raise FormatError(
                f"{path} is not the token store these packs were made from (its manifest sha256 differs), {manifest}, "
                "pass the right PackedDataset(sources=[...]) or re-run `packtool pack`"
            )
        tables.append(MediaTable.open(path))
    return tables


def vision_outputs(
    stacked: dict[str, Any] | None, items: Sequence[dict[str, Any]], pos: Any, refuse: str | None
) -> dict[str, Any]:
    """The collated vision keys of a batch ({} for a text batch): pixel rows and grids concatenated in order
    (left out when the batch holds no image),
    `position_ids` [4, 1, T] (flattened) or [4, B, N] for M-RoPE families, `token_type_ids` shaped like the ids.

    `refuse`: the collator option that cannot apply to images (context parallelism, `pad_to_length`)."""
    import torch

    per = _per_pack(stacked, items)
    if per is None:
        return {}
    if refuse is not None:
        raise ConfigError(
            f"{refuse} is not supported for a batch with images (M-RoPE positions and pixels), PackedCollator, leave it out"
        )
    pixels, grids, mrope, types = per
    out: dict[str, Any] = {}
    if len(pixels):  # a batch without images has no pixel keys (the models' vision path fails on 0 images)
        out["pixel_values"] = torch.from_numpy(np.ascontiguousarray(pixels))
        if grids is not None:
            out["image_grid_thw"] = torch.from_numpy(np.ascontiguousarray(grids, np.int64).reshape(-1, 3))
    shape = tuple(pos.shape)
    if mrope is not None:
        rows = torch.from_numpy(np.ascontiguousarray(mrope)).reshape(3, *shape)
        out["position_ids"] = torch.cat([pos.reshape(1, *shape), rows], 0)
    if types is not None:
        out["token_type_ids"] = torch.from_numpy(np.ascontiguousarray(types)).reshape(shape)
    return out


def _per_pack(
    stacked: dict[str, Any] | None, items: Sequence[dict[str, Any]]
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None] | None:
    """(pixel rows, grids, mrope [3, B, N] or [3, T], token types) of the batch, or None (no images)."""
    if stacked is not None:
        v = stacked.get("vision")
        if v is None:
            return None  # the batch's arrays as `VisionViews.batch` made them: no copy
        return v["pixel_values"], v.get("image_grid_thw"), v.get("mrope"), v.get("token_type_ids")
    if not any("pixel_values" in it for it in items):
        return None
    if not all("pixel_values" in it for it in items):
        raise ConfigError("some items carry pixel_values and some do not, PackedCollator, collate items of one store")
    pixels = np.concatenate([np.asarray(it["pixel_values"]) for it in items])
    grids = np.concatenate([np.asarray(it["image_grid_thw"]) for it in items]) if "image_grid_thw" in items[0] else None
    mrope = None
    if np.asarray(items[0]["position_ids"]).ndim == 2:  # [4, N]: rows 1..3 are the M-RoPE rows
        mrope = np.concatenate([np.asarray(it["position_ids"])[1:] for it in items], axis=1)
    types = np.concatenate([np.asarray(it["token_type_ids"]) for it in items]) if "token_type_ids" in items[0] else None
    return pixels, grids, mrope, types
