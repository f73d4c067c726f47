"""The kernels behind `varlen_attention`, in `auto`'s order of preference: the first usable row runs.

| backend  | function                                              | runs on                                   |
|----------|-------------------------------------------------------|-------------------------------------------|
| flash3   | `flash_attn_interface.flash_attn_varlen_func` (FA3)   | CUDA sm90 (Hopper), fp16/bf16             |
| flash4   | `flash_attn.cute.flash_attn_varlen_func` (FA4)        | CUDA sm90+, fp16/bf16                     |
| flash2   | `flash_attn.flash_attn_varlen_func` (FA2)             | CUDA sm80+, fp16/bf16                     |
| native   | `torch.nn.attention.varlen.varlen_attn` (torch≥2.10)  | CUDA sm80+, fp16/bf16, head_dim%8==0 ≤256 |
| fallback | exact SDPA per segment length (`fallback.py`)         | anything, every feature                   |

A row is skipped when its import fails (absent, or built against another torch or CUDA), the
device or dtype does not fit, or the call needs a feature the installed release lacks (a sliding
window, softcapping, sinks, dropout: `spec.FEATURES`); the fallback does them all, so `auto`
always finds one. Importing packtool never imports any kernel. The names are
`choices.AttentionBackend`'s (tests/test_attention.py ties the two).
"""

from __future__ import annotations

from packtool.attention.kernels import fallback, flash2, flash3, flash4, native
from packtool.attention.kernels.spec import KernelSpec

KERNELS: tuple[KernelSpec, ...] = (flash3.SPEC, flash4.SPEC, flash2.SPEC, native.SPEC, fallback.SPEC)
BY_NAME: dict[str, KernelSpec] = {spec.name: spec for spec in KERNELS}
#: `backend="flash"`: the flash-attn generations, best first
FLASH: tuple[str, ...] = tuple(spec.name for spec in KERNELS if spec.name.startswith("flash"))
