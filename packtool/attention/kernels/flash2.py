"""FA2: `flash_attn.flash_attn_varlen_func`, CUDA sm80+, fp16/bf16; window, softcap and dropout.

flash-attn 2.0 aligned causal attention to the top left when a segment has more keys than queries;
2.1 and later align it to the bottom right, which keys apart from queries (a KV cache, the
shared-prompt layout) need: 2.0 is refused for them by name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from packtool.attention.kernels import flash_api
from packtool.attention.kernels.spec import HALF, KernelSpec, Needs, lacking


def _version() -> tuple[int, ...]:
    text = str(getattr(sys.modules.get("flash_attn"), "__version__", "2.1"))
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check(fn: Callable[..., Any], needs: Needs) -> str | None:
    for feature in ("shared_prompt", "varlen_kv"):
        if getattr(needs, feature) and _version() < (2, 1):
            return lacking(feature, "flash-attn 2.0 aligns causal attention to the top left (2.1+: bottom right)")
    return flash_api.check(fn, needs)


SPEC = KernelSpec(
    name="flash2",
    summary="flash-attn 2, CUDA sm80+, fp16/bf16: window, softcap, dropout",
    module="flash_attn",
    attr="flash_attn_varlen_func",
    compute=(8, 99),
    dtypes=HALF,
    check=check,
    adapter=flash_api.adapter,
)
