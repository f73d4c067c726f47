"""FA3: `flash_attn_interface.flash_attn_varlen_func`, Hopper (sm90) only, fp16/bf16; window, softcap
(sinks where the release takes `s_aux`, no dropout)."""

from __future__ import annotations

from packtool.attention.kernels import flash_api
from packtool.attention.kernels.spec import HALF, KernelSpec

SPEC = KernelSpec(
    name="flash3",
    summary="flash-attn 3, CUDA sm90, fp16/bf16: window, softcap (sinks where the release has s_aux)",
    module="flash_attn_interface",
    attr="flash_attn_varlen_func",
    compute=(9, 9),
    dtypes=HALF,
    check=flash_api.check,
    adapter=flash_api.adapter,
)
