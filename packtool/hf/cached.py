"""Queries after a KV cache (decoding one token, or a chunk after a prefill): one sequence per row, causal from
the bottom right, unpadded by the 2-D mask; and the refusals of what such queries cannot be read as.

`layout.read` sends a call here when its keys run past its queries (a KV cache). Refused by name: `cu_seq_lens` with a
cache, a chunk whose `position_ids` restart (or `seq_idx` changes) inside a row (packed documents after a cache
would attend to each other and to the cache), a row whose first real query starts a new document at position 0
after cached tokens, and padding between cached tokens wider than a sliding window.
"""

from __future__ import annotations

from typing import Any

import torch

from packtool.errors import ConfigError
from packtool.hf.declared import kept_starts, position_starts
from packtool.hf.rows import Layout, Reading, cu_seqlens


def _refuse_documents_after_cache(
    b: int, tq: int, device: torch.device, mask: torch.Tensor | None, kwargs: dict[str, Any], tk: int
) -> None:
    """Queries after a cache are one sequence per row: a chunk whose `position_ids` restart (or `seq_idx` changes)
    inside a row's real queries holds several documents (a packed batch after a prefix cache, a packed prompt
    prefilled in chunks), which would attend to each other and to the cache: refused, never run as one."""
    keep = None if mask is None or mask.shape[1] < tq else mask[:, -tq:] != 0
    pos, seq = kwargs.get("position_ids"), kwargs.get("seq_idx")
    found: list[tuple[str, torch.Tensor | None]] = []
    if (
        isinstance(pos, torch.Tensor)
        and pos.ndim in (1, 2)
        and pos.shape[-1] == tq
        and pos.reshape(-1, tq).shape[0] in (1, b)
    ):
        found.append(("position_ids", position_starts(b, tq, device, pos)))
    if isinstance(seq, torch.Tensor) and seq.numel() == b * tq:
        flat = seq.reshape(b, tq).to(device)
        changes = torch.ones(b, tq, dtype=torch.bool, device=device)
        changes[:, 1:] = flat[:, 1:] != flat[:, :-1]
        found.append(("seq_idx", changes))
    if found and found[0][0] == "position_ids" and found[0][1] is not None and isinstance(pos, torch.Tensor):
        _refuse_a_document_starting_after_cache(b, tq, device, mask, keep, pos, tk)
    for name, starts in found:
        if starts is None:
            continue
        extra = kept_starts(starts, keep) & ~kept_starts(torch.zeros_like(starts), keep)
        if bool(extra.any()):
            row, col = extra.nonzero()[0].tolist()
            raise ConfigError(
                f"{name} start a new document at row {row}, token {col} of {tq} queries after a KV cache of {tk} keys "
                "(packed documents after a cache would attend to each other and to the cache), packtool.hf, run "
                "packed batches without a cache (past_key_values=None, use_cache=False), or one document per row"
            )


def _refuse_a_document_starting_after_cache(
    b: int,
    tq: int,
    device: torch.device,
    mask: torch.Tensor | None,
    keep: torch.Tensor | None,
    pos: torch.Tensor,
    tk: int,
) -> None:
    """A row whose first real query is at position 0 while real tokens sit in its cache starts a new document there
    (a packed prompt prefilled in chunks, a chunk starting on a document's first token; a document after a prefix
    cache): it would attend to the cache, whose documents are not its own. Refused, as a start inside the chunk is."""
    pos = pos.reshape(-1, tq).to(device).expand(b, tq)
    if mask is None:
        cached = torch.full((b,), tk - tq, device=device)
    elif mask.shape[1] > tq:
        cached = (mask[:, : mask.shape[1] - tq] != 0).sum(-1)
    else:
        return
    real = torch.ones(b, tq, dtype=torch.bool, device=device) if keep is None else keep
    col = torch.arange(tq, device=device).expand(b, tq)
    first = torch.where(real, col, tq).min(-1).values  # each row's first real query (tq: none)
    at = pos.gather(1, first.clamp(max=tq - 1)[:, None])[:, 0]
    bad = (first < tq) & (at == 0) & (cached > 0)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ConfigError(
            f"position_ids start a new document at row {row}, token {int(first[row])} of {tq} queries (position 0) "
            f"after a KV cache of {tk} keys holding {int(cached[row])} of that row's tokens (a document after a cache "
            "would attend to the cache's documents), packtool.hf, run packed batches without a cache "
            "(past_key_values=None, use_cache=False); a row that continues its cache (a prefix) takes positions "
            "after it, as transformers and PEFT count them"
        )


def after_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    kwargs: dict[str, Any],
    sliding_window: int | None,
) -> Reading:
    """Queries after a KV cache (decoding one token, or a chunk): one sequence per row, causal from the bottom
    right, unpadded by the 2-D mask (the keys a query may see; a static cache's empty slots are 0)."""
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        raise ConfigError(
            f"cu_seq_lens_q/_k reached a layer with a KV cache ({q.shape[1]} queries after {k.shape[1]} keys), "
            "packtool.hf, pass use_cache=False with packed batches (and no cu_seq_lens to generate)"
        )
    b, tq = q.shape[:2]
    dev = q.device
    if tq > 1:
        _refuse_documents_after_cache(b, tq, dev, mask, kwargs, k.shape[1])
    if mask is None:
        tk = k.shape[1]
        cu_q = torch.arange(b + 1, dtype=torch.int32, device=dev) * tq
        cu_k = torch.arange(b + 1, dtype=torch.int32, device=dev) * tk
        window = None if sliding_window is None or not 0 < int(sliding_window) < tk else int(sliding_window) - 1
        fq, fk, fv = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
        return Reading(Layout(fq, fk, fv, cu_q, cu_k, tq, tk, (b, tq)), None, window)
    mask = mask.bool()
    if k.shape[1] > mask.shape[1]:  # a static cache holds more slots than tokens seen
        k, v = k[:, : mask.shape[1]], v[:, : mask.shape[1]]
    if k.shape[1] != mask.shape[1]:
        raise ConfigError(
            f"attention_mask covers {mask.shape[1]} keys, the layer has {k.shape[1]}, packtool.hf, pass a mask over "
            "the cached and the new tokens"
        )
    index_k = mask.reshape(-1).nonzero().reshape(-1)
    lens_k = mask.sum(-1, dtype=torch.int32)
    cu_k = cu_seqlens(lens_k)
    col = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    first = torch.where(mask, col, mask.shape[1]).min(-1).values
    last = torch.where(mask, col, -1).max(-1).values
    span = (last - first + 1).clamp(min=0)
    holed = span > lens_k
    max_k, max_span, hole_span = torch.stack([lens_k.max().long(), span.max().long(),
                                              torch.where(holed, span, 0).max().long()]).tolist()  # fmt: skip
    window = None
    if sliding_window is not None and 0 < int(sliding_window) < max_span:
        window = int(sliding_window) - 1
        if hole_span > int(sliding_window):
            raise ConfigError(
                f"attention_mask has padding between the cached tokens of a row ({hole_span} keys) on a sliding-window "
                f"layer (window {int(sliding_window)}): eager counts the window over the padding, a varlen kernel "
                "cannot, packtool.hf, pad on the left or right only, or use attn_implementation='eager' for such masks"
            )
    flat_k, flat_v = (t.reshape(-1, *t.shape[2:]).index_select(0, index_k) for t in (k, v))
    if tq == 1:  # decoding: one query per row, after all of its keys
        index_q = torch.arange(b, device=dev)
        cu_q, max_q = torch.arange(b + 1, dtype=torch.int32, device=dev), 1
    else:  # a chunk after a cache: the queries are the mask's last columns (left padding)
        qmask = mask[:, -tq:]
        index_q = qmask.reshape(-1).nonzero().reshape(-1)
        lens_q = qmask.sum(-1, dtype=torch.int32)
        cu_q, max_q = cu_seqlens(lens_q), int(lens_q.max())
    flat_q = q.reshape(-1, *q.shape[2:]).index_select(0, index_q)
    if int(max_k) == 0:
        return Reading(None, None, window)
    return Reading(Layout(flat_q, flat_k, flat_v, cu_q, cu_k, max_q, int(max_k), (b, tq), index_q), None, window)
