"""Gemma 3: a fixed number of image tokens per image, a square resize, token types, no M-RoPE.

Rules (transformers 5.23, `processing_gemma3.py`, `image_processing_pil_gemma3.py`):
- the chat template renders `<start_of_image>` (the tokenizer's `boi_token`) once per image; the
  processor replaces it, in the TEXT before tokenizing, with
  `"\\n\\n" + boi + image_token * image_seq_length + eoi + "\\n\\n"`. The `\\n\\n` on either side is
  ordinary text, so it can merge with the neighbouring characters under BPE (two adjacent images
  leave "\\n\\n\\n\\n" between them, one token in Gemma's vocabulary): expanding the text first and tokenizing the whole
  string once, as the processor does, is what makes the ids equal. Expanding ids would not.
- every image is resized to `size` (896x896) with PIL bilinear, rescaled by 1/255 and normalised
  with mean = std = 0.5: pixel_values [k, 3, 896, 896].
- `token_type_ids` is 1 on the image tokens (`<image_soft_token>`), 0 elsewhere (boi/eoi too): the
  model attends bidirectionally inside each image block.
- pan-and-scan (`do_pan_and_scan`) adds crops and text ("Here is the original image ..."); it is off
  by default and refused by name when a folder turns it on.
`n_patches` counts the SigLIP encoder's patches ((896/14)^2 = 4096), what `--vision-budget` bounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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

IMAGENET_STANDARD = [0.5, 0.5, 0.5]


@register
class Gemma3(VisionProcessor):
    """Gemma 3 (see the module docstring)."""

    family = "gemma3"
    model_types = ("gemma3",)
    processor_classes = ("Gemma3Processor",)
    image_processor_types = ("Gemma3ImageProcessor",)
    token_type_ids = True

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.n_tokens = int(config["image_seq_length"])
        self.height, self.width = int(config["height"]), int(config["width"])
        self.grid = (1, self.height // int(config["vision_patch_size"]), self.width // int(config["vision_patch_size"]))
        boi, eoi, soft = config["boi_token"], config["eoi_token"], config["image_token"]
        self.sequence = f"\n\n{boi}{soft * self.n_tokens}{eoi}\n\n"

    @classmethod
    def build(cls, folder: ModelFolder, vocab: Mapping[str, int]) -> Gemma3:
        raw, where = folder.image_processor, folder.image_processor_file
        for source in (raw, folder.processor):
            if source.get("do_pan_and_scan"):
                raise ConfigError(
                    f"Gemma 3 pan-and-scan (do_pan_and_scan: true) is not supported, {where}; it adds image "
                    "crops and text per image: set it to false or null in the folder's processor config"
                )
        if not bool_setting(raw, "do_resize", True, where):
            raise ConfigError(f"do_resize: false is not supported for gemma3, {where}")
        size = square_setting(raw, "size", 224, where)
        if not (size.get("height") and size.get("width")):
            raise ConfigError(f"Gemma 3 'size' must hold height and width, got {size!r}, {where}")
        model = folder.model
        # Gemma3Processor(image_seq_length=256) takes it from processor_config.json, never from the image processor's
        text_len = int_setting(
            folder.processor, "image_seq_length", 256, folder.path / "processor_config.json", high=1 << 20
        )
        model_len = model.get("mm_tokens_per_image")
        if model_len is not None and model_len != text_len:
            raise ConfigError(
                f"the processor expands each image into {text_len} tokens but config.json mm_tokens_per_image "
                f"is {model_len}, {folder.path}, the folder mixes two models' files"
            )
        boi = folder.special_token("boi_token", "<start_of_image>")
        eoi = folder.special_token("eoi_token", "<end_of_image>")
        soft = folder.special_token("image_token", "<image_soft_token>")
        image_id = token_id(vocab, soft, folder.path, "image (soft)")
        for token, role in ((boi, "begin-of-image"), (eoi, "end-of-image")):
            token_id(vocab, token, folder.path, role)
        model_id = model.get("image_token_index", model.get("image_token_id"))
        if isinstance(model_id, int) and model_id != image_id:
            raise ConfigError(
                f"config.json image_token_index {model_id} is not the tokenizer's {soft!r} ({image_id}), "
                f"{folder.path}, the folder mixes two models' files"
            )
        vision = folder.vision_config
        return cls(
            {
                "family": "gemma3",
                "placeholder": boi,
                "reserved_tokens": [soft],
                "boi_token": boi,
                "eoi_token": eoi,
                "image_token": soft,
                "image_token_id": image_id,
                "image_seq_length": text_len,
                "height": int_setting(size, "height", 224, where, high=1 << 15),
                "width": int_setting(size, "width", 224, where, high=1 << 15),
                "vision_patch_size": int_setting(vision, "patch_size", 14, folder.path / "config.json", high=1024),
                **pixel_settings(raw, where, 2, IMAGENET_STANDARD, IMAGENET_STANDARD),
            }
        )

    def measure(self, data: bytes, name: str = "image") -> ImageInfo:
        images.decode(data, name, self.config["do_convert_rgb"])  # decodable, within the size limit
        return ImageInfo(n_tokens=self.n_tokens, grid=self.grid, n_patches=self.grid[1] * self.grid[2])

    def replacement(self, info: ImageInfo) -> str:
        return self.sequence

    def pixel_rows(self, images_: Sequence[bytes], names: Sequence[str] | None = None) -> tuple[np.ndarray, None]:
        c = self.config
        rows = []
        for i, data in enumerate(images_):
            img = images.decode(data, names[i] if names is not None else f"image {i}", c["do_convert_rgb"])
            size = (self.height, self.width)
            rows.append(
                images.to_floats(img, size, c["resample"], c["rescale_factor"], c["image_mean"], c["image_std"])
            )
        if not rows:
            return np.zeros((0, 3, self.height, self.width), np.float32), None
        return np.stack(rows), None

    def token_types(self, ids: np.ndarray) -> np.ndarray:
        return (np.asarray(ids) == self.image_token_id).astype(np.int64)
