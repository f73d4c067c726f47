"""FA4: `flash_attn.cute.flash_attn_varlen_func`, sm90+, fp16/bf16; window, softcap, `learnable_sink`
(no dropout; no max_seqlen arguments: the adapter passes only the keywords the release takes)."""

from __future__ import annotations

from packtool.attention.kernels import flash_api
from packtool.attention.kernels.spec import HALF, KernelSpec

SPEC = KernelSpec(
    name="flash4",
    summary="flash-attn 4 (CuTe), CUDA sm90+, fp16/bf16: window, softcap, sinks",
    module="flash_attn.cute",
    attr="flash_attn_varlen_func",
    compute=(9, 99),
    dtypes=HALF,
    check=flash_api.check,
    adapter=flash_api.adapter,
)
