"""FA2: `flash_attn.flash_attn_varlen_func`, CUDA sm80+, fp16/bf16; window, softcap and dropout."""

from __future__ import annotations

from packtool.attention.kernels import flash_api
from packtool.attention.kernels.spec import HALF, KernelSpec

SPEC = KernelSpec(
    name="flash2",
    summary="flash-attn 2, CUDA sm80+, fp16/bf16: window, softcap, dropout",
    module="flash_attn",
    attr="flash_attn_varlen_func",
    compute=(8, 99),
    dtypes=HALF,
    check=flash_api.check,
    adapter=flash_api.adapter,
)
