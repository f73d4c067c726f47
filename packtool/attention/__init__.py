"""Attention over packed sequences: each token attends only within its own document.

- `varlen_attention(q, k, v, cu_seqlens, max_seqlen, causal=True, softmax_scale=None,
  backend="auto", *, cu_seqlens_k=, max_seqlen_k=, window=, softcap=, sinks=, dropout=)` on
  `(total_tokens, heads, head_dim)`: flash-attn (FA3/FA4/FA2) when installed on CUDA, else torch's
  native `varlen_attn` (torch >= 2.10, CUDA), else the exact SDPA fallback; each kernel one spec in
  the ordered table `kernels/registry.py`. `select_backend(q, backend)` names the kernel a call runs.
- `document_block_mask(cu_seqlens, total_len)` / `DocumentMaskCache`: a document-causal
  FlexAttention `BlockMask` built from `cu_seqlens` without a T×T mask;
  `flex_varlen_attention(q, k, v, cu_seqlens)` runs `flex_attention` with it.
- `shared_prompt_attention(q, k, v, cu_seqlens, prefix_segment)`: the shared-prompt layout of
  `pack --share-prompt` (a completion attends its prompt's keys and its own), exact on every
  kernel that aligns causal attention to the bottom right, refused by name on the others;
  `shared_prompt_block_mask` is its FlexAttention mask.

Kernels are imported on first use: importing packtool.attention needs torch only.
"""

from packtool.attention.flex import DocumentMaskCache, document_block_mask, document_ids, flex_varlen_attention
from packtool.attention.shared_prompt import (
    SharedPromptLayout,
    shared_prompt_attention,
    shared_prompt_block_mask,
    shared_prompt_layout,
)
from packtool.attention.varlen import flash_available, native_available, select_backend, varlen_attention

__all__ = [
    "DocumentMaskCache",
    "SharedPromptLayout",
    "document_block_mask",
    "document_ids",
    "flash_available",
    "flex_varlen_attention",
    "native_available",
    "select_backend",
    "shared_prompt_attention",
    "shared_prompt_block_mask",
    "shared_prompt_layout",
    "varlen_attention",
]
