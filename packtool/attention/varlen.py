"""`varlen_attention`: attention restricted to the segments of a packed sequence, on the best kernel here.

`backend="auto"` walks `kernels.registry.KERNELS`: flash-attn (FA3, FA4, then FA2) on CUDA
fp16/bf16 when installed, else torch's own `varlen_attn` (torch >= 2.10, CUDA: the path on
machines without flash-attn), else the exact SDPA fallback (CPU, float32/64, any GPU, every
feature). A kernel that lacks a feature the call needs (a sliding window, softcapping, sinks,
dropout) is passed over, with a warning on CUDA. `select_backend` says which one a call runs;
`backend=` forces one and fails with the reason when it cannot run. The kernels get `cu_seqlens`
as contiguous int32 on q's device and are not re-validated (that would sync the GPU each layer);
the fallback checks `cu_seqlens` like the collator does.
"""

from __future__ import annotations

import logging
from functools import cache

import torch

from packtool.attention.kernels import registry, spec
from packtool.attention.kernels.spec import Call, Needs
from packtool.choices import AttentionBackend
from packtool.errors import ConfigError

logger = logging.getLogger(__name__)

_ALIASES = {"torch": AttentionBackend.FALLBACK}  # the name `fallback` had before torch grew its own varlen kernel


def _parse(backend: str | AttentionBackend) -> AttentionBackend:
    if isinstance(backend, str) and backend in _ALIASES:
        return _ALIASES[backend]
    try:
        return AttentionBackend(backend)
    except ValueError:
        names = ", ".join(b.value for b in AttentionBackend)
        raise ConfigError(f"unknown attention backend {backend!r}, varlen_attention, use one of {names}") from None


def select_backend(q: torch.Tensor, backend: str | AttentionBackend = "auto", needs: Needs | None = None) -> str:
    """The kernel `varlen_attention(q, ..., backend=backend)` runs: flash3, flash4, flash2, native or fallback.

    `needs` adds what the call asks beyond q (GQA, window, softcap, sinks, dropout, other key
    lengths). Raises ConfigError naming every reason when a forced backend cannot run.
    """
    needs = needs or Needs.of(q)
    choice = _parse(backend)
    if choice is AttentionBackend.AUTO:
        reasons: list[str] = []
        for kernel in registry.KERNELS:
            why = spec.unusable(kernel, needs)
            if why is None:
                if kernel.name == "fallback" and needs.device.type == "cuda":
                    _warn_fallback(tuple(reasons))
                return kernel.name
            reasons.append(f"{kernel.name}: {why}")
        raise RuntimeError("the exact fallback refused a call")  # unreachable: it takes everything
    names = registry.FLASH if choice is AttentionBackend.FLASH else (choice.value,)
    reasons = []
    for name in names:
        why = spec.unusable(registry.BY_NAME[name], needs)
        if why is None:
            return name
        reasons.append(f"{name}: {why}")
    raise ConfigError(
        f"attention backend {choice.value!r} cannot run here ({'; '.join(reasons)}), varlen_attention, "
        "use backend='auto' (it passes on to a kernel that can, down to the exact SDPA fallback)"
    )


@cache
def _warn_fallback(reasons: tuple[str, ...]) -> None:
    logger.warning("varlen_attention runs the exact SDPA fallback on CUDA (slow): %s", "; ".join(reasons))


def flash_available(q: torch.Tensor) -> bool:
    """True when a flash-attn kernel (FA2/3/4) can run on q: installed, CUDA, fp16/bf16."""
    return any(spec.unusable(registry.BY_NAME[name], Needs.of(q)) is None for name in registry.FLASH)


def native_available(q: torch.Tensor) -> bool:
    """True when torch's own `varlen_attn` can run on q (torch >= 2.10, CUDA sm80+, fp16/bf16)."""
    return spec.unusable(registry.BY_NAME["native"], Needs.of(q)) is None


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool = True,
    softmax_scale: float | None = None,
    backend: str | AttentionBackend = "auto",
    *,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_k: int | None = None,
    window: tuple[int, int] | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    dropout: float = 0.0,
    shared_prompt: bool = False,
) -> torch.Tensor:
    """Attention of `(total_tokens, heads, head_dim)` q/k/v within each `cu_seqlens` segment.

    k and v may have fewer heads than q (GQA/MQA) as long as they divide q's heads.
    Zero-length segments (static `cu_seqlens` padding) are allowed. `backend`: `auto`, `flash`
    (the best flash-attn here), `flash2`/`flash3`/`flash4`, `native` (torch's `varlen_attn`) or
    `fallback` (exact SDPA; `torch` is its old name).

    Beyond packing: `cu_seqlens_k`/`max_seqlen_k` when keys are segmented apart from queries (a KV
    cache: causal attention is then aligned to the bottom right, the last query sees every key);
    `window=(left, right)` a sliding window in flash-attn's inclusive convention (-1 unbounded;
    transformers' `sliding_window=W` is `(W - 1, W - 1)`); `softcap` Gemma 2's `tanh(s / c) * c`
    on the scores; `sinks` one logit per query head added to each softmax (gpt-oss); `dropout`
    on the attention probabilities (pass 0 outside training); `shared_prompt` says the keys are a
    shared-prompt layout's (`shared_prompt_attention` passes it, so a kernel that cannot align causal
    attention to the bottom right is refused by that name).
    """
    if (
        q.ndim != 3
        or k.ndim != 3
        or v.ndim != 3
        or k.shape != v.shape
        or q.shape[2] != k.shape[2]
        or (cu_seqlens_k is None and q.shape[0] != k.shape[0])
    ):
        raise ConfigError(
            f"q, k, v must be (total_tokens, heads, head_dim) with matching tokens and head_dim, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, varlen_attention, reshape [B, N, H, D] to [B*N, H, D]"
        )
    if q.shape[1] % k.shape[1]:
        raise ConfigError(
            f"query heads ({q.shape[1]}) are not a multiple of key/value heads ({k.shape[1]}), varlen_attention, use a GQA layout with kv heads dividing q heads"
        )
    if sinks is not None and sinks.numel() != q.shape[1]:
        raise ConfigError(
            f"sinks has {sinks.numel()} values for {q.shape[1]} query heads, varlen_attention, pass one sink logit per query head"
        )
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(
            f"dropout {dropout} is outside [0, 1), varlen_attention, pass the attention dropout probability"
        )
    cu = cu_seqlens.reshape(-1).to(device=q.device, dtype=torch.int32).contiguous()
    cu_k = cu if cu_seqlens_k is None else cu_seqlens_k.reshape(-1).to(device=q.device, dtype=torch.int32).contiguous()
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    call = Call(
        q,
        k,
        v,
        cu,
        cu_k,
        int(max_seqlen),
        int(max_seqlen if max_seqlen_k is None else max_seqlen_k),
        causal=causal,
        scale=softmax_scale,
        window=(-1, -1) if window is None else (int(window[0]), int(window[1])),
        softcap=softcap or None,
        sinks=sinks,
        dropout=float(dropout),
        shared_prompt=bool(shared_prompt),
    )
    name = select_backend(q, backend, call.needs())
    return spec.run(registry.BY_NAME[name], call)
