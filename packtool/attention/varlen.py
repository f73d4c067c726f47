"""`varlen_attention`: attention restricted to the segments of a packed sequence, on the best kernel here.

`backend="auto"` runs flash-attn (FA3, FA4, then FA2) on CUDA fp16/bf16 when installed, else
torch's own `varlen_attn` (torch >= 2.10, CUDA: the path on machines without flash-attn), else
the exact SDPA fallback (CPU, float32/64, any GPU). `select_backend` says which one a call runs;
`backend=` forces one and fails with the reason when it cannot run. The kernels get `cu_seqlens`
as contiguous int32 on q's device and are not re-validated (that would sync the GPU each layer);
the fallback checks `cu_seqlens` like the collator does.
"""

from __future__ import annotations

import torch

from packtool.attention import backends
from packtool.attention.fallback import sdpa_segments
from packtool.choices import AttentionBackend
from packtool.errors import ConfigError

_ALIASES = {"torch": AttentionBackend.FALLBACK}  # the name `fallback` had before torch grew its own varlen kernel


def _parse(backend: str | AttentionBackend) -> AttentionBackend:
    if isinstance(backend, str) and backend in _ALIASES:
        return _ALIASES[backend]
    try:
        return AttentionBackend(backend)
    except ValueError:
        names = ", ".join(b.value for b in AttentionBackend)
        raise ConfigError(f"unknown attention backend {backend!r}, varlen_attention, use one of {names}") from None


def select_backend(q: torch.Tensor, backend: str | AttentionBackend = "auto") -> str:
    """The kernel `varlen_attention(q, ..., backend=backend)` runs: flash3, flash4, flash2, native or fallback.

    Raises ConfigError naming every reason when a forced backend cannot run on q.
    """
    choice = _parse(backend)
    if choice is AttentionBackend.FALLBACK:
        return "fallback"
    if choice is AttentionBackend.AUTO:
        return next((n for n in (*backends.FLASH, "native") if backends.unusable(n, q) is None), "fallback")
    names = backends.FLASH if choice is AttentionBackend.FLASH else (choice.value,)
    reasons = []
    for name in names:
        why = backends.unusable(name, q)
        if why is None:
            return name
        reasons.append(f"{name}: {why}")
    raise ConfigError(
        f"attention backend {choice.value!r} cannot run here ({'; '.join(reasons)}), varlen_attention, "
        "use backend='auto' (falls back to torch's native kernel, then to the exact SDPA fallback)"
    )


def flash_available(q: torch.Tensor) -> bool:
    """True when a flash-attn kernel (FA2/3/4) can run on q: installed, CUDA, fp16/bf16."""
    return any(backends.unusable(name, q) is None for name in backends.FLASH)


def native_available(q: torch.Tensor) -> bool:
    """True when torch's own `varlen_attn` can run on q (torch >= 2.10, CUDA sm80+, fp16/bf16)."""
    return backends.unusable("native", q) is None


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool = True,
    softmax_scale: float | None = None,
    backend: str | AttentionBackend = "auto",
) -> torch.Tensor:
    """Attention of `(total_tokens, heads, head_dim)` q/k/v within each `cu_seqlens` segment.

    k and v may have fewer heads than q (GQA/MQA) as long as they divide q's heads.
    Zero-length segments (static `cu_seqlens` padding) are allowed. `backend`: `auto`, `flash`
    (the best flash-attn here), `flash2`/`flash3`/`flash4`, `native` (torch's `varlen_attn`) or
    `fallback` (exact SDPA; `torch` is its old name).
    """
    if (
        q.ndim != 3
        or k.ndim != 3
        or v.ndim != 3
        or k.shape != v.shape
        or q.shape[0] != k.shape[0]
        or q.shape[2] != k.shape[2]
    ):
        raise ConfigError(
            f"q, k, v must be (total_tokens, heads, head_dim) with matching tokens and head_dim, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, varlen_attention, reshape [B, N, H, D] to [B*N, H, D]"
        )
    if q.shape[1] % k.shape[1]:
        raise ConfigError(
            f"query heads ({q.shape[1]}) are not a multiple of key/value heads ({k.shape[1]}), varlen_attention, use a GQA layout with kv heads dividing q heads"
        )
    name = select_backend(q, backend)
    if name == "fallback":
        return sdpa_segments(q, k, v, cu_seqlens, int(max_seqlen), causal, softmax_scale)
    cu = cu_seqlens.reshape(-1).to(device=q.device, dtype=torch.int32).contiguous()
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return backends.run(name, q, k, v, cu, int(max_seqlen), causal, softmax_scale)
