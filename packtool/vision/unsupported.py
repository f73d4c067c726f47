"""Vision-language families packtool recognises but does not build yet: a model folder of one of
these is refused by name (a ConfigError listing the families that are built), never read as text.

Each row: (config.json `model_type`s, `processor_class`es, `image_processor_type`s). Generic image
processors shared by many families (CLIP, SigLIP) are not listed: they name no family.
"""

from __future__ import annotations

from packtool.vision.base import unsupported

unsupported("LLaVA-NeXT", ("llava_next",), ("LlavaNextProcessor",), ("LlavaNextImageProcessor",))
unsupported("LLaVA-OneVision", ("llava_onevision",), ("LlavaOnevisionProcessor",), ("LlavaOnevisionImageProcessor",))
unsupported("SmolVLM", ("smolvlm",), ("SmolVLMProcessor",), ("SmolVLMImageProcessor",))
unsupported("Idefics3", ("idefics3",), ("Idefics3Processor",), ("Idefics3ImageProcessor",))
unsupported("Idefics2", ("idefics2",), ("Idefics2Processor",), ("Idefics2ImageProcessor",))
unsupported("PaliGemma", ("paligemma",), ("PaliGemmaProcessor",), ())
unsupported("Gemma 3n", ("gemma3n",), ("Gemma3nProcessor",), ())
unsupported("Mllama (Llama 3.2 Vision)", ("mllama",), ("MllamaProcessor",), ("MllamaImageProcessor",))
unsupported("Llama 4", ("llama4",), ("Llama4Processor",), ("Llama4ImageProcessor",))
unsupported("InternVL", ("internvl",), ("InternVLProcessor",), ())
unsupported("Pixtral / Mistral 3", ("mistral3", "pixtral"), ("PixtralProcessor",), ("PixtralImageProcessor",))
unsupported("Qwen2.5-Omni", ("qwen2_5_omni",), ("Qwen2_5OmniProcessor",), ())
