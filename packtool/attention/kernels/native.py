"""torch's own `torch.nn.attention.varlen.varlen_attn` (torch >= 2.10): CUDA sm80+, fp16/bf16, head_dim%8==0 <= 256.

Keys apart from queries (`cu_seq_k != cu_seq_q`: a KV cache, the shared-prompt layout): its flash
backend calls `aten._flash_attention_forward` directly (torch's vendored FA2, causal aligned to
the bottom right per segment, as flash-attn >= 2.1; SDPA's own top-left check is bypassed). Its
cuDNN backend (`_should_use_cudnn`, False in torch 2.13) builds a top-left causal mask: refused.

The kernel the lent GPUs have without flash-attn. Its signature changed between releases: 2.10
takes `is_causal`, 2.11 `window_size` (`(-1, 0)` = causal, `(W, 0)` = causal within W) and `scale`,
2.13 also `enable_gqa`. The adapter reads the installed signature: what it lacks is done around it
(GQA by repeating k/v heads, a scale by rescaling q); a sliding window needs 2.11+. No softcap, no
sinks, no dropout (the kernel hard-codes dropout 0): `auto` passes such calls on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from packtool.attention.kernels.spec import HALF, Call, KernelSpec, Needs, lacking, parameters

#: what a wrapper taking **kwargs is assumed to accept (2.13's keywords)
ASSUMED = frozenset({"window_size", "scale", "enable_gqa"})


def _cudnn(needs: Needs) -> bool:
    """Whether varlen_attn would take its cuDNN backend (top-left causal) on this device; its flash backend
    (torch's vendored FA2) aligns causal attention to the bottom right. torch 2.13 never takes cuDNN."""
    try:
        from torch.nn.attention import varlen as module

        should = getattr(module, "_should_use_cudnn", None)
        return bool(should(needs.device.index or 0)) if should is not None and needs.device.type == "cuda" else False
    except Exception:  # noqa: BLE001 - a torch without the helper: its varlen_attn is the flash backend
        return False


def check(fn: Callable[..., Any], needs: Needs) -> str | None:
    if needs.head_dim % 8 or needs.head_dim > 256:
        return f"head_dim {needs.head_dim} is not a multiple of 8 up to 256"
    for feature in ("softcap", "sinks", "dropout"):
        if getattr(needs, feature):
            return lacking(feature, "torch's varlen_attn has none")
    if (needs.shared_prompt or needs.varlen_kv) and _cudnn(needs):
        feature = "shared_prompt" if needs.shared_prompt else "varlen_kv"
        return lacking(feature, "torch's varlen_attn runs cuDNN here, whose causal mask is aligned to the top left")
    if needs.window and "window_size" not in (parameters(fn) or ASSUMED):
        return lacking("window", f"torch {torch.__version__}'s varlen_attn has no window_size (torch >= 2.11 has)")
    return None


def adapter(fn: Callable[..., Any], call: Call) -> Any:
    accepted = parameters(fn) or ASSUMED
    q, k, v = call.q, call.k, call.v
    kwargs: dict[str, Any] = {}
    if "window_size" in accepted:  # torch >= 2.11
        left, right = call.window
        kwargs["window_size"] = (left, 0 if call.causal else right)
    elif "is_causal" in accepted:  # torch 2.10
        kwargs["is_causal"] = call.causal
    elif call.causal:
        raise RuntimeError("this torch's varlen_attn takes neither window_size nor is_causal")
    if call.scale is not None:
        if "scale" in accepted:
            kwargs["scale"] = call.scale
        else:  # the kernel's own scale is 1/sqrt(head_dim)
            q = q * (call.scale * math.sqrt(q.shape[-1]))
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in accepted:
            kwargs["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return fn(q, k, v, call.cu_q, call.cu_k, call.max_q, call.max_k, **kwargs)


SPEC = KernelSpec(
    name="native",
    summary="torch.nn.attention.varlen.varlen_attn (torch >= 2.10), CUDA sm80+, fp16/bf16: window (2.11+)",
    module="torch.nn.attention.varlen",
    attr="varlen_attn",
    compute=(8, 99),
    dtypes=HALF,
    check=check,
    adapter=adapter,
)
