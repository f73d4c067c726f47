"""Where the documents are in a transformers attention call: `[B, T, H, D]` tensors -> varlen rows and back.

The same cases, in the same order, as transformers' flash-attention path
(`modeling_flash_attention_utils._flash_attention_forward`), so one model object serves training,
evaluation and generation:
1. a 2-D `attention_mask` (padding; also a KV cache): unpad the keys by the mask and the queries
   by its last `T_q` columns (left padding) or, decoding one token, one query per row; an int32
   segment mask (`mask.py`: packed documents, chunks, bidirectional blocks read from the model's
   mask pattern) gives the segments itself (`from_segments`);
2. `cu_seq_lens_q/_k` (+ `max_length_q/_k`): packed batches whose collator knows its documents
   (`PackedCollator(keys=HF_KEYS)`, TRL's `padding_free`), flattened as they are;
3. `position_ids` that restart inside a row (TRL / `DataCollatorWithFlattening` pass only those):
   a document starts wherever the position is not the previous one + 1, and at every row start,
   so `[B, N]` rows of packed documents are kept apart too (flash-attn only splits `[1, T]`);
   multimodal RoPE positions `[3, B, T]` cannot say where a document starts: rows, as case 4;
4. otherwise every row is one sequence; with a KV cache and no mask, `T_k > T_q` and causal
   attention is aligned to the bottom right (the newest query sees every key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from packtool.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    """Flattened `(tokens, heads, head_dim)` q/k/v, their segments, and where the queries go back."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    shape: tuple[int, int]  # (B, T_q) of the model's batch
    index_q: torch.Tensor | None = None  # flat positions of the kept queries (None: all, in order)

    def repad(self, out: torch.Tensor) -> torch.Tensor:
        """`(tokens, heads, dim)` -> `[B, T_q, heads, dim]`; dropped (padding) queries get 0, as flash-attn gives."""
        b, t = self.shape
        if self.index_q is not None:
            full = out.new_zeros(b * t, *out.shape[1:])
            out = full.index_copy(0, self.index_q, out)
        return out.view(b, t, *out.shape[1:])


def _cu(lengths: torch.Tensor) -> torch.Tensor:
    return F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


def _max(cu: torch.Tensor, given: Any) -> int:
    if given is not None:
        return int(given)
    return int(torch.diff(cu).max()) if cu.numel() > 1 else 0


def from_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> Layout:
    """Case 1: unpad by a 2-D padding mask `[B, T_k]` (1 = a real token)."""
    if mask.ndim != 2:
        raise ConfigError(
            f"attention_mask of shape {tuple(mask.shape)} reached attn_implementation='packtool', which takes the 2-D "
            "padding mask [batch, keys] only, packtool.hf, pass the 2-D mask (transformers builds the rest) or use "
            "attn_implementation='sdpa' for a custom 4-D mask"
        )
    b, tq = q.shape[:2]
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
    cu_k = _cu(lens_k)
    max_k = int(lens_k.max())
    flat_k, flat_v = (t.reshape(-1, *t.shape[2:]).index_select(0, index_k) for t in (k, v))
    if tq == k.shape[1]:
        index_q, cu_q, max_q = index_k, cu_k, max_k
    elif tq == 1:  # decoding: one query per row, after all of its keys
        index_q = torch.arange(b, device=q.device)
        cu_q, max_q = torch.arange(b + 1, dtype=torch.int32, device=q.device), 1
    else:  # a chunk after a cache: the queries are the mask's last columns (left padding)
        qmask = mask[:, -tq:]
        index_q = qmask.reshape(-1).nonzero().reshape(-1)
        lens_q = qmask.sum(-1, dtype=torch.int32)
        cu_q, max_q = _cu(lens_q), int(lens_q.max())
    flat_q = q.reshape(-1, *q.shape[2:]).index_select(0, index_q)
    return Layout(flat_q, flat_k, flat_v, cu_q, cu_k, max_q, max_k, (b, tq), index_q)


def _flat(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])


def from_cu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict[str, Any]) -> Layout:
    """Case 2: the collator's `cu_seq_lens_q/_k` and `max_length_q/_k` over the flattened batch."""
    cu_q = kwargs["cu_seq_lens_q"].reshape(-1)
    given_k = kwargs.get("cu_seq_lens_k")
    cu_k = cu_q if given_k is None or given_k is cu_q else given_k.reshape(-1)
    max_q = _max(cu_q, kwargs.get("max_length_q"))
    max_k = max_q if cu_k is cu_q else _max(cu_k, kwargs.get("max_length_k"))
    return Layout(*_flat(q, k, v), cu_q, cu_k, max_q, max_k, tuple(q.shape[:2]))  # type: ignore[arg-type]


def from_positions(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, position_ids: torch.Tensor | None) -> Layout:
    """Cases 3 and 4: documents from restarting `position_ids`, else one sequence per row."""
    b, tq = q.shape[:2]
    tk = k.shape[1]
    dev = q.device
    if position_ids is None or tq != tk or tq == 1:
        cu_q = torch.arange(b + 1, dtype=torch.int32, device=dev) * tq
        cu_k = cu_q if tk == tq else torch.arange(b + 1, dtype=torch.int32, device=dev) * tk
        return Layout(*_flat(q, k, v), cu_q, cu_k, tq, tk, (b, tq))
    pos = position_ids
    if pos.ndim == 1:
        pos = pos[None]
    if pos.ndim == 3:  # multimodal RoPE: image tokens repeat positions, so restarts say nothing; one row each
        return from_positions(q, k, v, None)
    if pos.ndim != 2 or pos.shape[-1] != tq:
        raise ConfigError(
            f"position_ids of shape {tuple(position_ids.shape)} for {b} rows of {tq} tokens, packtool.hf, pass "
            "[batch, tokens] position_ids, or cu_seq_lens_q/_k for packed documents"
        )
    pos = pos.to(dev).expand(b, tq)
    start = torch.ones(b, tq, dtype=torch.bool, device=dev)
    start[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    starts = start.reshape(-1).nonzero().reshape(-1).to(torch.int32)
    cu = torch.cat([starts, torch.tensor([b * tq], dtype=torch.int32, device=dev)])
    longest = _max(cu, None)
    return Layout(*_flat(q, k, v), cu, cu, longest, longest, (b, tq))


@dataclass(frozen=True)
class Blocks:
    """Bidirectional blocks of a causal layer (Gemma 3's image tokens): their queries see their whole block.

    A second varlen call, non-causal: the queries of each block (`index_q` into the layout's flattened
    queries) against the keys from their segment's start to the block's end (`index_k`), so a query sees
    the causal past of its document and the rest of its block, as transformers' `blockwise_overlay`.
    """

    index_q: torch.Tensor
    index_k: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def from_segments(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ids: torch.Tensor, position_ids: torch.Tensor | None = None
) -> tuple[Layout, Blocks | None]:
    """Case 1, segment mask (`mask.py`): int32 `[B, T_k]` of `2 * segment + joined_with_next`, 0 = padding.

    The queries are the first T_q keys (a prefill or a training forward; a static cache's empty slots
    are 0). The segments and blocks are computed once per mask and kept on it, so the layers sharing a
    mask pay for them once. `position_ids` that restart where no segment starts mean transformers built
    the mask without the documents (it finds them only without a KV cache): a row that is one segment
    (causal, bidirectional, image blocks) is cut at the restarts, as `from_positions` cuts a row; a row
    the pattern already cuts (chunks, counted from the row's start, not the document's) is refused.
    """
    b, tq = q.shape[:2]
    if ids.shape != (b, k.shape[1]) or k.shape[1] < tq:
        raise ConfigError(
            f"a segment mask of shape {tuple(ids.shape)} for {b} rows of {tq} queries and {k.shape[1]} keys, "
            "packtool.hf, build the mask with packtool.hf's mask function (AttentionMaskInterface)"
        )
    if k.shape[1] > tq:  # a static cache during prefill: the slots past the queries are empty
        k, v = k[:, :tq], v[:, :tq]
    ids = ids[:, :tq] if ids.shape[1] > tq else ids
    cached = getattr(ids, "_packtool_segments", None)
    if cached is None or cached[0] is not position_ids:
        cached = (position_ids, _segments(_with_documents(ids, position_ids)))
        ids._packtool_segments = cached  # type: ignore[attr-defined]
    index, cu, longest, links = cached[1]
    flat_q, flat_k, flat_v = _flat(q, k, v)
    if index is not None:
        flat_q, flat_k, flat_v = (t.index_select(0, index) for t in (flat_q, flat_k, flat_v))
    rows = Layout(flat_q, flat_k, flat_v, cu, cu, longest, longest, (b, tq), index)
    return rows, links


def _with_documents(ids: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
    """`ids` with a segment start wherever `position_ids` restart inside a segment (see `from_segments`)."""
    b, t = ids.shape
    pos = None if position_ids is None else position_ids[None] if position_ids.ndim == 1 else position_ids
    if pos is None or pos.ndim != 2 or pos.shape[-1] != t or t < 2:
        return ids
    pos = pos.to(ids.device).expand(b, t)
    seg = ids >> 1
    restart = torch.zeros(b, t, dtype=torch.bool, device=ids.device)
    restart[:, 1:] = (pos[:, 1:] != pos[:, :-1] + 1) & (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] > 0)
    if not bool(restart.any()):
        return ids
    kept = seg > 0
    cut = torch.zeros_like(kept)
    cut[:, 1:] = (seg[:, 1:] != seg[:, :-1]) & kept[:, 1:] & kept[:, :-1]
    if bool(cut.any()):
        raise ConfigError(
            "packed documents (position_ids restarting inside a row) reached a layer whose mask pattern transformers "
            "built without them and cut at the row's own positions (chunked attention; transformers finds packed "
            "documents only without a KV cache), packtool.hf, pass use_cache=False for packed batches "
            "(model(**batch, use_cache=False)), or batch this model's documents padded (attention_mask)"
        )
    start = restart | F.pad(~kept[:, :-1], (1, 0), value=True)
    segment = torch.cumsum(start.to(ids.dtype), -1)
    joined = (ids & 1) * F.pad(~restart[:, 1:], (0, 1), value=True).to(ids.dtype)  # no block across documents
    return (2 * segment + joined) * kept.to(ids.dtype)


def _segments(ids: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, int, Blocks | None]:
    """(kept flat positions or None, cu_seqlens over the kept tokens, longest segment, blocks or None)."""
    b, t = ids.shape
    seg = ids >> 1
    keep = seg > 0
    start = keep.clone()
    start[:, 1:] &= seg[:, 1:] != seg[:, :-1]
    index = keep.reshape(-1).nonzero().reshape(-1)
    n = int(index.numel())
    first = start.reshape(-1).index_select(0, index)
    starts = first.nonzero().reshape(-1).to(torch.int32)
    cu = torch.cat([starts, torch.tensor([n], dtype=torch.int32, device=ids.device)])
    longest = _max(cu, None)
    link = (ids & 1).reshape(-1).index_select(0, index).bool()
    blocks = _blocks(link, first, cu) if bool(link.any()) else None
    return (None if n == b * t else index), cu, longest, blocks


def _blocks(link: torch.Tensor, first: torch.Tensor, cu: torch.Tensor) -> Blocks:
    """Runs of kept tokens joined to the next one: each run's queries and the keys its queries see."""
    dev = link.device
    before = F.pad(link[:-1], (1, 0))  # token j joined to j - 1
    member = link | before
    run_start = (member & ~before).nonzero().reshape(-1)
    run_end = (member & ~link).nonzero().reshape(-1)  # inclusive
    segment = torch.cumsum(first.to(torch.int64), 0) - 1  # each kept token's segment
    seg_start = cu.to(torch.int64).index_select(0, segment.index_select(0, run_start))
    lens_q = run_end - run_start + 1
    lens_k = run_end - seg_start + 1
    index_q = member.nonzero().reshape(-1)
    offsets = torch.repeat_interleave(seg_start - torch.cumsum(lens_k, 0) + lens_k, lens_k)
    index_k = offsets + torch.arange(int(lens_k.sum()), device=dev)
    return Blocks(index_q, index_k, _cu(lens_q.to(torch.int32)), _cu(lens_k.to(torch.int32)),
                  int(lens_q.max()), int(lens_k.max()))  # fmt: skip
