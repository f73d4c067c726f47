"""What flash-attn's three generations share: keyword names, the features a release's signature offers.

FA2 (`flash_attn`), FA3 (`flash_attn_interface`) and FA4 (`flash_attn.cute`) all take
`(q, k, v, cu_seqlens_q=, cu_seqlens_k=, ...)` on `(tokens, heads, head_dim)` tensors, GQA
natively, and align causal attention to the bottom right when keys outnumber queries. Their
optional features differ by release, so they are read from the installed function's signature:
a sliding window (`window_size=(left, right)`, or FA4's `window_size_left/right`), `softcap`,
`dropout_p` (FA2 only), attention sinks (`s_aux` in vLLM's FA3, `learnable_sink` in FA4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from packtool.attention.kernels.spec import Call, Needs, lacking, parameters

#: feature -> keywords that provide it (any one)
KEYWORDS = {
    "window": ("window_size", "window_size_left"),
    "softcap": ("softcap",),
    "sinks": ("s_aux", "learnable_sink"),
    "dropout": ("dropout_p",),
    "varlen_kv": ("cu_seqlens_k",),
    "shared_prompt": ("cu_seqlens_k",),
}
#: what a function taking **kwargs is assumed to accept (FA2's names)
ASSUMED = frozenset({"window_size", "softcap", "dropout_p", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"})


def check(fn: Callable[..., Any], needs: Needs) -> str | None:
    accepted = parameters(fn) or ASSUMED
    for feature in needs.features():
        if not any(word in accepted for word in KEYWORDS[feature]):
            return lacking(feature, f"this release takes none of {', '.join(KEYWORDS[feature])}")
    return None


def adapter(fn: Callable[..., Any], call: Call) -> Any:
    accepted = parameters(fn)
    names = accepted or ASSUMED | {"softmax_scale", "causal"}
    kwargs: dict[str, Any] = {
        "cu_seqlens_q": call.cu_q,
        "cu_seqlens_k": call.cu_k,
        "max_seqlen_q": call.max_q,
        "max_seqlen_k": call.max_k,
        "softmax_scale": call.scale,
        "causal": call.causal,
    }
    if call.window != (-1, -1):
        left, right = call.window
        if "window_size" in names:
            kwargs["window_size"] = (left, right)
        else:  # FA4: None is unbounded
            kwargs["window_size_left"] = None if left < 0 else left
            kwargs["window_size_right"] = None if right < 0 else right
    if call.softcap is not None:
        kwargs["softcap"] = call.softcap
    if call.dropout > 0:
        kwargs["dropout_p"] = call.dropout
    if call.sinks is not None:
        sink = call.sinks.to(call.q.dtype)
        kwargs["s_aux" if "s_aux" in names else "learnable_sink"] = sink
    if accepted is not None:
        kwargs = {key: val for key, val in kwargs.items() if key in accepted}
    return fn(call.q, call.k, call.v, **kwargs)
