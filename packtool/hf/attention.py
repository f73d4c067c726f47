"""The function transformers calls for `attn_implementation="packtool"`: its arguments -> `varlen_attention`.

transformers calls `fn(module, query, key, value, attention_mask, scaling=, dropout=,
sliding_window=, softcap=, s_aux=, position_ids=, cu_seq_lens_q=, ...)` with `[B, heads, T, D]`
tensors and expects `([B, T, heads, D], None)`. The batch (a padding or segment mask, collator
offsets, `seq_idx`, restarting position_ids, plain rows, a KV cache) becomes varlen segments
through ONE reading, the same on every layer (`layout.read`); the layer's features become `varlen_attention`'s: causal unless the call or the
module says otherwise (`is_causal=False`, Gemma 3's bidirectional mode), transformers'
`sliding_window=W` (W tokens, the current one included) as flash-attn's window `(W - 1, W - 1)`,
`softcap`, the sinks `s_aux` (gpt-oss; `sinks` when it holds one logit per head), `dropout`
(> 0 only while training), values narrower than queries (MLA: padded, then cropped), and the
bidirectional blocks of a segment mask (a second, non-causal call for their queries). An argument
that asks for more than a varlen kernel does (a score bias, a per-query choice of keys) or that
packtool does not know is refused by name (`features.py`). The kernel is `varlen_attention`'s
choice (`backend`): the first in its table that has every feature the layer uses, so a layer never
runs on a kernel that would ignore one; a forced backend that lacks one is a ConfigError naming it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F

from packtool.attention import varlen_attention
from packtool.choices import AttentionBackend
from packtool.errors import ConfigError
from packtool.hf import layout, shared_prompt
from packtool.hf.features import refuse_call

logger = logging.getLogger(__name__)


@functools.cache
def _warn_no_weights() -> None:
    logger.warning(
        "attn_implementation='packtool' does not return attention weights (output_attentions=True gives no "
        "attentions, as sdpa and flash-attention); use attn_implementation='eager' to get them"
    )


@torch.compiler.disable  # host-side reading of the batch (a sync per forward): runs eagerly under torch.compile
def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    *,
    backend: str | AttentionBackend = "auto",
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over `varlen_attention` (see the module docstring)."""
    heads = query.shape[1]
    sinks = kwargs.get("sinks")
    if s_aux is None and isinstance(sinks, torch.Tensor) and sinks.numel() == heads:
        s_aux = kwargs.pop("sinks").reshape(heads)  # one sink logit per head, under another name
    prefix = shared_prompt.pop(kwargs)  # a preference batch's keys; the shared-prompt layout (hf/shared_prompt.py)
    refuse_call(kwargs, heads)
    if kwargs.get("output_attentions"):
        _warn_no_weights()
    if heads % key.shape[1]:
        raise ConfigError(
            f"{heads} query heads are not a multiple of {key.shape[1]} key/value heads, packtool.hf, "
            "use a model whose kv heads divide its query heads"
        )
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, T, heads, D]
    dim_v = v.shape[-1]
    if dim_v < q.shape[-1]:  # MLA: values narrower than queries; pad and crop, as transformers does for flash
        v = F.pad(v, (0, q.shape[-1] - dim_v))
    elif dim_v > q.shape[-1]:
        raise ConfigError(
            f"values of head size {dim_v} are wider than queries and keys ({q.shape[-1]}), packtool.hf, "
            "use attn_implementation='sdpa' or 'eager' for this model"
        )
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    reading = layout.read(q, k, v, attention_mask, kwargs, sliding_window, prefix=prefix, causal=causal, owner=module)
    rows, blocks, window = reading.rows, reading.blocks, reading.window  # the batch's one reading
    if rows is None:  # no real token in the batch: padding gets 0, as flash-attention gives it
        return q.new_zeros(*q.shape[:-1], dim_v), None
    features: dict[str, Any] = {
        "softmax_scale": scaling,
        "backend": backend,
        "softcap": softcap or None,
        "sinks": s_aux,
        "dropout": float(dropout or 0.0),
    }
    out = varlen_attention(
        rows.q,
        rows.k,
        rows.v,
        rows.cu_q,
        rows.max_q,
        causal=causal,
        cu_seqlens_k=None if rows.cu_k is rows.cu_q else rows.cu_k,
        max_seqlen_k=rows.max_k,
        window=None if window is None else (window, window),
        shared_prompt=prefix is not None,
        **features,
    )
    if blocks is not None and causal:  # each block's queries see the rest of their block too
        inside = varlen_attention(
            rows.q.index_select(0, blocks.index_q),
            rows.k.index_select(0, blocks.index_k),
            rows.v.index_select(0, blocks.index_k),
            blocks.cu_q,
            blocks.max_q,
            causal=False,
            cu_seqlens_k=blocks.cu_k,
            max_seqlen_k=blocks.max_k,
            window=None if window is None else (window, -1),
            **features,
        )
        out = out.index_copy(0, blocks.index_q, inside)
    out = rows.repad(out)
    return (out[..., :dim_v] if out.shape[-1] != dim_v else out), None
