"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: grid-dependent token counts and M-RoPE, one adapter.

For still images the three share every rule; what differs is read from the folder, not assumed:
- `patch_size` 14 (Qwen2-VL, Qwen2.5-VL) or 16 (Qwen3-VL); `merge_size` 2; `temporal_patch_size` 2;
- the pixel range: `min_pixels` / `max_pixels` (Qwen2-VL, Qwen2.5-VL) or `size` {`shortest_edge`,
  `longest_edge`} (Qwen3-VL; top-level `min_pixels` / `max_pixels` win, as in the processor);
- normalisation: CLIP mean/std (2, 2.5) or 0.5 (3).
The Qwen3-VL processor's `<t seconds>` timestamps and per-frame vision markers are for videos only;
images expand the same way in all three (`Qwen*VLProcessor.replace_image_token`).

Rules (transformers 5.23, `image_processing_pil_qwen2_vl.py`, `modeling_qwen2_vl.py`):
- `smart_resize`: both sides rounded to a multiple of patch*merge, pixels kept in [min, max];
  grid (1, h/patch, w/patch); image tokens h*w/merge^2; vision patches t*h*w (one row of
  pixel_values each, 3*2*patch^2 floats: the still image repeated over the temporal patch);
- each `<|image_pad|>` of the rendered text becomes n_tokens copies of itself;
- M-RoPE (`Qwen2VLModel.get_rope_index`; Qwen2.5-VL and Qwen3-VL keep the same image branch):
  text runs count up on all three rows; an image run at position p takes t = p,
  h = p + row, w = p + column (in merged patches), and the text after it restarts at
  p + max(h, w) / merge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import ConfigError, InputError
from packtool.vision import images
from packtool.vision.base import ImageInfo, VisionProcessor, register
from packtool.vision.folder import (
    ModelFolder,
    bool_setting,
    int_setting,
    pixel_settings,
    token_id,
)

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
#: what the family key is, by the name a folder gives it
FAMILY_BY_NAME = {
    "Qwen2VLProcessor": "qwen2_vl",
    "Qwen2_5_VLProcessor": "qwen2_5_vl",
    "Qwen3VLProcessor": "qwen3_vl",
    "qwen2_vl": "qwen2_vl",
    "qwen2_5_vl": "qwen2_5_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_moe": "qwen3_vl",
}
MAX_ASPECT = 200


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' `smart_resize`, line for line (Python `round`, so halves round to even)."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"absolute aspect ratio must be smaller than {MAX_ASPECT}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _tuple(values: list[float] | None) -> tuple[float, ...] | None:
    return None if values is None else tuple(values)


def _pixel_bound(raw: Mapping[str, Any], key: str, size_keys: tuple[str, ...], default: int, where: Path) -> int:
    """A top-level `min_pixels` / `max_pixels` wins over `size` (the processor's `__init__` does so)."""
    if raw.get(key) is not None:
        return int_setting(raw, key, None, where)
    size = raw.get("size")
    if size is None:
        return default
    if isinstance(size, Mapping):
        for k in size_keys:
            if size.get(k) is not None:
                return int_setting(size, k, None, where)
    # the processor's resize needs shortest_edge and longest_edge: anything else fails there
    raise ConfigError(
        f"'size' must hold {size_keys[0]!r} (or a top-level {key!r}), got {size!r}, {where}, "
        "write the pixel range as the family's preprocessor_config.json does"
    )


@register
class QwenVL(VisionProcessor):
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL (see the module docstring)."""

    family = "qwen2_vl"
    families = ("qwen2_5_vl", "qwen3_vl")
    model_types = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
    processor_classes = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor")
    image_processor_types = ("Qwen2VLImageProcessor",)
    mrope = True
    uses_grid = True

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        c = config
        self.patch = int(c["patch_size"])
        self.merge = int(c["merge_size"])
        self.temporal = int(c["temporal_patch_size"])
        self.spatial_merge = int(c["spatial_merge_size"])
        self.min_pixels = int(c["min_pixels"])
        self.max_pixels = int(c["max_pixels"])

    @classmethod
    def build(cls, folder: ModelFolder, vocab: Mapping[str, int]) -> QwenVL:
        raw, where = folder.image_processor, folder.image_processor_file
        family = (
            FAMILY_BY_NAME.get(folder.processor_class or "")
            or FAMILY_BY_NAME.get(folder.model_type or "")
            or ("qwen3_vl" if raw.get("patch_size") == 16 else "qwen2_vl")
        )
        min_pixels = _pixel_bound(raw, "min_pixels", ("shortest_edge", "min_pixels"), 56 * 56, where)
        max_pixels = _pixel_bound(raw, "max_pixels", ("longest_edge", "max_pixels"), 28 * 28 * 1280, where)
        if not bool_setting(raw, "do_resize", True, where):
            raise ConfigError(f"do_resize: false is not supported for {family} (the grid needs the resize), {where}")
        merge = int_setting(raw, "merge_size", 2, where, high=64)
        image_token = folder.special_token("image_token", "<|image_pad|>")
        image_id = token_id(vocab, image_token, folder.path, "image")
        model = folder.model
        vision = folder.vision_config
        spatial = int_setting(vision, "spatial_merge_size", merge, folder.path / "config.json", high=64)
        if spatial != merge:
            raise ConfigError(
                f"the image processor merges {merge}x{merge} patches but the model's vision_config.spatial_merge_size "
                f"is {spatial}, {folder.path}, the folder mixes two models' files"
            )
        patch = int_setting(raw, "patch_size", 14, where, high=1024)
        model_patch = int_setting(vision, "patch_size", patch, folder.path / "config.json", high=1024)
        if model_patch != patch:
            raise ConfigError(
                f"the image processor cuts {patch}-pixel patches but the model's vision_config.patch_size is "
                f"{model_patch}, {folder.path}, the folder mixes two models' files"
            )
        model_id = model.get("image_token_id", model.get("image_token_index"))
        if isinstance(model_id, int) and model_id != image_id:
            raise ConfigError(
                f"config.json image_token_id {model_id} is not the tokenizer's {image_token!r} ({image_id}), "
                f"{folder.path}, the folder mixes two models' files"
            )
        config: dict[str, Any] = {
            "family": family,
            "placeholder": image_token,
            "reserved_tokens": [t for t in (folder.special_token("video_token", "<|video_pad|>"),) if t in vocab],
            "image_token": image_token,
            "image_token_id": image_id,
            "patch_size": patch,
            "temporal_patch_size": int_setting(raw, "temporal_patch_size", 2, where, high=64),
            "merge_size": merge,
            "spatial_merge_size": spatial,
            "min_pixels": min_pixels,
            "max_pixels": max_pixels,
            **pixel_settings(raw, where, 3, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
        }
        return cls(config)

    # -- measure / expand -----------------------------------------------------------------------
    def _target_size(self, height: int, width: int, name: str) -> tuple[int, int]:
        try:
            return smart_resize(height, width, self.patch * self.merge, self.min_pixels, self.max_pixels)
        except ValueError:
            raise InputError(
                f"{name} is {width}x{height}: an aspect ratio over {MAX_ASPECT}:1, which the {self.family} "
                "processor refuses",
                hint="crop or pad the image",
            ) from None

    def _info(self, height: int, width: int) -> ImageInfo:
        gh, gw = height // self.patch, width // self.patch
        return ImageInfo(n_tokens=gh * gw // (self.merge * self.merge), grid=(1, gh, gw), n_patches=gh * gw)

    def measure(self, data: bytes, name: str = "image") -> ImageInfo:
        height, width = images.size_of(data, name, self.config["do_convert_rgb"])
        return self._info(*self._target_size(height, width, name))

    def replacement(self, info: ImageInfo) -> str:
        return self.placeholder * info.n_tokens

    # -- pixels ---------------------------------------------------------------------------------
    def pixel_rows(self, images_: Sequence[bytes], names: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        c = self.config
        rows: list[np.ndarray] = []
        grids: list[tuple[int, int, int]] = []
        for i, data in enumerate(images_):
            name = names[i] if names is not None else f"image {i}"
            img = images.decode(data, name, c["do_convert_rgb"])
            size = self._target_size(img.height, img.width, name)
            hwc = images.resized(img, size, c["resample"])
            rows.append(
                self._patch_rows(
                    hwc, images.value_table(c["rescale_factor"], _tuple(c["image_mean"]), _tuple(c["image_std"]))
                )
            )
            grids.append(self._info(*size).grid)
        dim = 3 * self.temporal * self.patch * self.patch
        pixels = np.concatenate(rows, axis=0) if rows else np.zeros((0, dim), np.float32)
        return pixels, np.asarray(grids, dtype=np.int64).reshape(-1, 3)

    def _patch_rows(self, hwc: np.ndarray, table: np.ndarray) -> np.ndarray:
        """`Qwen2VLImageProcessorPil.patchify` of the rescaled, normalised image: [gh*gw, C*T*p*p] float32,
        rows in merge-window order, columns (channel, temporal copy, patch row, patch column). The uint8
        pixels are put in patch order first, then looked up in the value table (`images.value_table`)."""
        p, m, t = self.patch, self.merge, self.temporal
        height, width, channels = hwc.shape
        gh, gw = height // p, width // p
        chw = hwc.transpose(2, 0, 1).reshape(channels, gh // m, m, p, gw // m, m, p)
        u8 = np.ascontiguousarray(chw.transpose(1, 4, 2, 5, 0, 3, 6)).reshape(gh * gw, channels, p * p)
        out = np.empty((gh * gw, channels, t, p * p), dtype=np.float32)
        for c in range(channels):  # per channel, never per pixel
            out[:, c, :, :] = np.take(table[c], u8[:, c, :])[:, None, :]  # the still image, repeated over time
        return out.reshape(gh * gw, channels * t * p * p)

    # -- positions ------------------------------------------------------------------------------
    def rope_positions(self, ids: np.ndarray, grids: np.ndarray) -> np.ndarray:
        """int64 [3, n]: `get_rope_index` of this one document (see the module docstring)."""
        ids = np.asarray(ids).reshape(-1)
        grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
        n = len(ids)
        is_image = ids == self.image_token_id
        edges = np.flatnonzero(np.diff(np.concatenate(([0], is_image.astype(np.int8), [0]))))
        starts, ends = edges[0::2], edges[1::2]
        if len(starts) != len(grids):
            raise InputError(
                f"the document holds {len(starts)} run(s) of image tokens but {len(grids)} image grid(s) "
                "(two images with no text between them cannot be told apart, as in the model's get_rope_index)"
            )
        m = self.spatial_merge
        out = np.empty((3, n), dtype=np.int64)
        cur = 0
        prev = 0
        for (t, h, w), s, e in zip(grids.tolist(), starts.tolist(), ends.tolist(), strict=True):
            out[:, prev:s] = np.arange(s - prev, dtype=np.int64) + cur
            cur += s - prev
            lh, lw = h // m, w // m
            if e - s != t * lh * lw:
                raise InputError(
                    f"an image run of {e - s} tokens does not match its grid {(t, h, w)} ({t * lh * lw} tokens)"
                )
            out[0, s:e] = np.repeat(np.arange(t, dtype=np.int64), lh * lw) + cur
            out[1, s:e] = np.tile(np.repeat(np.arange(lh, dtype=np.int64), lw), t) + cur
            out[2, s:e] = np.tile(np.arange(lw, dtype=np.int64), t * lh) + cur
            cur += max(h, w) // m
            prev = e
        out[:, prev:] = np.arange(n - prev, dtype=np.int64) + cur
        return out
