"""Vision-language families: each model family's image processor rules, torch-free (docs/VISION.md).

`VisionProcessor.from_dir(model_dir, vocab)` reads a model folder and returns its family adapter
(None for a text-only folder); `VisionProcessor.from_config(manifest["vision"]["processor"])`
rebuilds it from a store. One module per family, registered in `base.REGISTRY`.
"""

from __future__ import annotations

from packtool.vision import gemma3 as _gemma3  # noqa: F401  (registers the family)
from packtool.vision import llava as _llava  # noqa: F401  (registers the family)
from packtool.vision import qwen2_vl as _qwen2_vl  # noqa: F401  (registers the family)
from packtool.vision import unsupported as _unsupported  # noqa: F401  (names the families not built)
from packtool.vision.base import REGISTRY, ImageInfo, VisionProcessor

__all__ = ["REGISTRY", "ImageInfo", "VisionProcessor"]
