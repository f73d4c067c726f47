"""LLaVA-1.5: a CLIP image processor and a fixed count of `<image>` tokens per image.

Rules (transformers 5.23, `processing_llava.py`, `image_processing_pil_clip.py`):
- resize: `size` {`shortest_edge`: 336} keeps the aspect ratio (short side 336, long side
  `int(336 * long / short)`), or `size` {`height`, `width`} sets both; PIL bicubic by default;
- centre crop to `crop_size` (336x336), rescale, normalise (CLIP mean/std): pixel_values [k, 3, 336, 336];
- each `<image>` of the rendered text becomes `<image>` * n, n = (H/patch)*(W/patch) +
  `num_additional_image_tokens` (1 for CLIP's CLS) - 1 when `vision_feature_select_strategy` is
  "default" (the CLS feature is dropped): 576 for llava-1.5-7b-hf. `patch_size`, the strategy and
  the additional tokens are the processor's (`processor_config.json`); without `patch_size` the
  processor cannot count, and the folder is refused.
No M-RoPE, no token types, no grid in the batch. LLaVA-NeXT and LLaVA-OneVision (anyres tiling)
are other families, refused by name (`unsupported.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import ConfigError
from packtool.vision import images
from packtool.vision.base import ImageInfo, VisionProcessor, register
from packtool.vision.folder import (
    ModelFolder,
    bool_setting,
    int_setting,
    pixel_settings,
    square_setting,
    token_id,
)

OPENAI_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def _resize_rule(raw: Mapping[str, Any], where: Path) -> tuple[int | None, tuple[int, int]]:
    """(shortest edge, or None and a fixed (height, width)), read as `CLIPImageProcessorPil` and
    `PilBackend.resize` read `size` (an int is a shortest edge; `use_square_size` makes it square)."""
    size = raw.get("size", {"shortest_edge": 224})
    if isinstance(size, int) and not isinstance(size, bool):
        size = {"shortest_edge": size}
    if not isinstance(size, Mapping):
        raise ConfigError(f"llava 'size' must be an object, got {size!r}, {where}")
    if size.get("longest_edge") is not None:
        raise ConfigError(f"llava 'size' with a longest_edge is not supported, got {dict(size)!r}, {where}")
    if size.get("shortest_edge") is not None:
        edge = int_setting(size, "shortest_edge", None, where, high=1 << 15)
        return (None, (edge, edge)) if raw.get("use_square_size") else (edge, (0, 0))
    if size.get("height") is not None and size.get("width") is not None:
        return None, (
            int_setting(size, "height", None, where, high=1 << 15),
            int_setting(size, "width", None, where, high=1 << 15),
        )
    raise ConfigError(f"llava 'size' must hold shortest_edge, or height and width, got {dict(size)!r}, {where}")


def resized_size(height: int, width: int, shortest: int | None, size: tuple[int, int] | None) -> tuple[int, int]:
    """`get_resize_output_image_size(default_to_square=False)` for a shortest edge, else the fixed size."""
    if size is not None or shortest is None:
        return size or (height, width)
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = shortest, int(shortest * long / short)
    return (new_long, new_short) if width <= height else (new_short, new_long)


@register
class Llava(VisionProcessor):
    """LLaVA-1.5 (see the module docstring)."""

    family = "llava"
    model_types = ("llava",)
    processor_classes = ("LlavaProcessor",)

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        c = config
        self.shortest = c["shortest_edge"]
        self.size = (int(c["height"]), int(c["width"])) if c["height"] is not None else None
        self.crop = (int(c["crop_height"]), int(c["crop_width"])) if c["crop_height"] is not None else None
        self.patch = int(c["patch_size"])

    @classmethod
    def build(cls, folder: ModelFolder, vocab: Mapping[str, int]) -> Llava:
        raw, where = folder.image_processor, folder.image_processor_file
        proc, proc_file = folder.processor, folder.path / "processor_config.json"
        if proc.get("patch_size") is None:
            raise ConfigError(
                f"processor_config.json has no patch_size, {folder.path}: LlavaProcessor cannot count image tokens "
                "without it; add the vision tower's patch size (14 for llava-1.5) to processor_config.json"
            )
        patch = int_setting(proc, "patch_size", None, proc_file, high=1024)
        strategy = proc.get("vision_feature_select_strategy")
        extra = int_setting(proc, "num_additional_image_tokens", 0, proc_file, low=0, high=1024)
        if not bool_setting(raw, "do_resize", True, where):
            raise ConfigError(f"do_resize: false is not supported for llava, {where}")
        shortest, fixed = _resize_rule(raw, where)
        crop = square_setting(raw, "crop_size", 224, where)
        do_crop = bool_setting(raw, "do_center_crop", True, where)
        crop_h = int_setting(crop, "height", 224, where, high=1 << 15) if do_crop else None
        crop_w = int_setting(crop, "width", 224, where, high=1 << 15) if do_crop else None
        low_h, low_w = (shortest, shortest) if shortest is not None else fixed  # the smallest a resized image gets
        if crop_h is not None and crop_w is not None and (low_h < crop_h or low_w < crop_w):
            raise ConfigError(
                f"llava resize can leave an image smaller than crop_size {dict(crop)!r}, where the processor pads; "
                f"packtool does not build that case, {where}"
            )
        token = folder.special_token("image_token", str(proc.get("image_token") or "<image>"))
        image_id = token_id(vocab, token, folder.path, "image")
        model_id = folder.model.get("image_token_index", folder.model.get("image_token_id"))
        if isinstance(model_id, int) and model_id != image_id:
            raise ConfigError(
                f"config.json image_token_index {model_id} is not the tokenizer's {token!r} ({image_id}), "
                f"{folder.path}, the folder mixes two models' files"
            )
        return cls(
            {
                "family": "llava",
                "placeholder": token,
                "image_token": token,
                "image_token_id": image_id,
                "shortest_edge": shortest,
                "height": fixed[0] if shortest is None else None,
                "width": fixed[1] if shortest is None else None,
                "crop_height": crop_h,
                "crop_width": crop_w,
                "patch_size": patch,
                "num_additional_image_tokens": extra,
                "vision_feature_select_strategy": strategy,
                **pixel_settings(raw, where, 3, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD),
            }
        )

    def _final_size(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(resized size, size of the pixel rows after the crop)."""
        resized = resized_size(height, width, self.shortest, self.size)
        return resized, self.crop if self.crop is not None else resized

    def _count(self, height: int, width: int) -> ImageInfo:
        n = (height // self.patch) * (width // self.patch)
        tokens = n + int(self.config["num_additional_image_tokens"])
        if self.config["vision_feature_select_strategy"] == "default":
            tokens -= 1
        return ImageInfo(n_tokens=tokens, grid=(1, height // self.patch, width // self.patch), n_patches=n)

    def measure(self, data: bytes, name: str = "image") -> ImageInfo:
        h, w = images.size_of(data, name, self.config["do_convert_rgb"])
        return self._count(*self._final_size(h, w)[1])

    def replacement(self, info: ImageInfo) -> str:
        return self.placeholder * info.n_tokens

    def pixel_rows(self, images_: Sequence[bytes], names: Sequence[str] | None = None) -> tuple[np.ndarray, None]:
        c = self.config
        rows = []
        for i, data in enumerate(images_):
            img = images.decode(data, names[i] if names is not None else f"image {i}", c["do_convert_rgb"])
            resized, _ = self._final_size(img.height, img.width)
            img = img.resize(
                (resized[1], resized[0]), resample=images.resample_filter(c["resample"]), reducing_gap=None
            )
            if self.crop is not None:  # center_crop, on the uint8 image as the processor does
                top, left = (img.height - self.crop[0]) // 2, (img.width - self.crop[1]) // 2
                img = img.crop((left, top, left + self.crop[1], top + self.crop[0]))
            rows.append(
                images.to_floats(img, None, c["resample"], c["rescale_factor"], c["image_mean"], c["image_std"])
            )
        if not rows:
            h, w = self.crop if self.crop is not None else (0, 0)
            return np.zeros((0, 3, h, w), np.float32), None
        return np.stack(rows), None
