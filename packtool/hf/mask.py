"""The attention mask transformers builds for `attn_implementation="packtool"`: flash-attention's.

transformers prepares each layer's mask through `masking_utils.AttentionMaskInterface`, keyed by
the implementation name; a name it does not know gets NO mask at all (so a padded batch would
attend to its padding). "packtool", like flash-attention, takes the 2-D padding mask, sliced to
the layer's keys, or None when there is no padding: the 4-D float mask of sdpa/eager would
materialise T×T per layer, which is what varlen kernels avoid. One case flash-attention leaves
to `generate` (which keeps the mask for flash names only): a static KV cache whose slots exceed
the tokens seen gets a mask of the slots filled, so the empty ones are never attended.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from packtool.errors import ConfigError


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """`[B, kv_length]` bool (True = a real key), or None when every key is real.

    Chunked attention (Llama 4's `attention_chunk_size`) is refused once a sequence outgrows a chunk,
    as transformers refuses it for flash-attention: the layout has no way to say "this chunk only".
    """
    chunk = getattr(kwargs.get("config"), "attention_chunk_size", None)
    if isinstance(chunk, int) and 0 < chunk < kv_length + kv_offset:
        raise ConfigError(
            f"chunked attention (config.attention_chunk_size={chunk}: Llama 4) over {kv_length + kv_offset} tokens "
            "cannot run as attn_implementation='packtool', packtool.hf, use attn_implementation='sdpa' or "
            "'flex_attention' for this model"
        )
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:]  # a sliding-window cache keeps the last keys
        if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
            return None
        return attention_mask
    seen = q_offset + q_length - kv_offset  # keys written so far (a static cache has kv_length slots)
    if isinstance(seen, int) and seen >= kv_length:
        return None
    device = kwargs.get("device", seen.device if isinstance(seen, torch.Tensor) else "cpu")
    slots = torch.arange(kv_length, device=device)
    return (slots < seen).expand(batch_size, kv_length)
