"""Attention for the shared-prompt layout (`pack --share-prompt`): each pair's prompt held once.

A packed row holds, per pair, three segments `[prompt P][chosen C][rejected R]`, and
`prefix_segment[s]` names, for a completion segment s, the prompt segment it continues from
(-1 for every other segment). Each sequence must see what it would see alone:
- P attends P causally;
- C attends P + C (contiguous in the row: one causal segment `P ++ C`);
- R attends P then R, causal from the bottom right: its queries against the keys `P ++ R`,
  which are not contiguous in the row, so they are gathered.

That is ordinary varlen attention with separate query and key segments: query segments
`[P+C]`, `[R]` and key segments `[P+C]`, `[P ++ R]` (`cu_seqlens_q != cu_seqlens_k`), causal
aligned to the bottom right (R's query i sits at key `len(P) + i`). A sliding window measured in
the gathered keys is the window measured in each sequence's own positions, so it stays exact.
Every kernel of `kernels/registry.py` either runs it exactly or is refused by name (the feature
`shared_prompt`): flash-attn >= 2.1 (FA2, FA3, FA4) and torch's native `varlen_attn` (its flash
backend, torch's vendored FA2) align causal attention to the bottom right when a segment has
more keys than queries; flash-attn 2.0 aligned it to the top left and torch's cuDNN varlen
backend uses a top-left causal mask: both are refused. The exact SDPA fallback does it on any
device. FlexAttention: `shared_prompt_block_mask` (a mask_mod over the row).

`shared_prompt_layout` computes the segments once per batch (vectorised, one host sync for the
checks); `shared_prompt_attention` runs a layer with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from packtool.choices import AttentionBackend
from packtool.errors import ConfigError, FormatError

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

WHERE = "shared-prompt attention"


@dataclass(frozen=True)
class SharedPromptLayout:
    """Query and key segments of a shared-prompt row (`shared_prompt_layout`).

    cu_q: int32 offsets of the query groups over the row's tokens (a prompt and the completion that
    follows it directly form one group; every other segment is its own group). cu_k: int32 offsets
    of each group's keys in the gathered key order `index_k` (int64 row positions: the group's
    prompt, when it is not in the group, then the group's own tokens). `index_k` is None when no
    group needs another segment's keys (cu_k is then cu_q).
    """

    cu_q: torch.Tensor
    cu_k: torch.Tensor
    index_k: torch.Tensor | None
    max_q: int
    max_k: int
    total: int

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """The keys (or values) `(tokens, heads, dim)` in the layout's key order."""
        return t if self.index_k is None else t.index_select(0, self.index_k)


def _cu(lengths: torch.Tensor) -> torch.Tensor:
    return F.pad(torch.cumsum(lengths, 0), (1, 0))


def check_prefix_segment(cu: torch.Tensor, prefix: torch.Tensor, where: str = WHERE) -> None:
    """Raise FormatError unless `prefix` (int, one per segment of `cu`) names earlier prompt segments only."""
    n = cu.numel() - 1
    if prefix.ndim != 1 or prefix.numel() != n:
        raise FormatError(
            f"prefix_segment has {prefix.numel()} values for {n} segments of cu_seqlens, {where}, "
            "pass one value per segment (-1 or the index of the segment's prompt)"
        )
    if n == 0:
        return
    idx = torch.arange(n, device=prefix.device)
    named = prefix.clamp(min=0)
    bad_range = (prefix < -1) | (prefix >= idx)
    chained = (prefix >= 0) & (prefix.index_select(0, named) != -1)
    lens = torch.diff(cu.to(torch.int64))
    faults = torch.stack([bad_range.any(), chained.any(), (lens < 0).any()]).tolist()
    if faults[0]:
        raise FormatError(
            f"prefix_segment names a segment that is not an earlier one (values {prefix[bad_range][:4].tolist()}), "
            f"{where}, a completion names the index of its prompt segment, which comes before it; -1 elsewhere"
        )
    if faults[1]:
        raise FormatError(
            f"prefix_segment names a completion as another completion's prompt, {where}, "
            "a prompt segment has prefix_segment -1"
        )
    if faults[2]:
        raise FormatError(f"cu_seqlens decreases, {where}, pass the batch's cu_seqlens")


def shared_prompt_layout(
    cu_seqlens: torch.Tensor, prefix_segment: torch.Tensor, *, check: bool = True
) -> SharedPromptLayout:
    """The query/key segments of a shared-prompt row from its segments and their `prefix_segment`.

    `cu_seqlens` (int, `[S + 1]`) over the row's tokens; `prefix_segment` (int, `[S]`): for each
    segment, -1 or the index of the earlier prompt segment it continues from. Vectorised; `check`
    verifies `prefix_segment` (one host sync).
    """
    cu = cu_seqlens.reshape(-1).to(torch.int64)
    prefix = prefix_segment.reshape(-1).to(device=cu.device, dtype=torch.int64)
    if check:
        check_prefix_segment(cu, prefix)
    n = cu.numel() - 1
    dev = cu.device
    total = int(cu[-1]) if n >= 0 else 0
    if n <= 0:
        zero = torch.zeros(1, dtype=torch.int32, device=dev)
        return SharedPromptLayout(zero, zero, None, 0, 0, total)
    lens = torch.diff(cu)
    idx = torch.arange(n, device=dev)
    joined = (prefix >= 0) & (prefix == idx - 1)  # a completion right after its prompt: one causal segment P ++ C
    head = ~joined
    group = torch.cumsum(head.to(torch.int64), 0) - 1
    n_groups = int(group[-1]) + 1
    lens_q = torch.zeros(n_groups, dtype=torch.int64, device=dev).index_add(0, group, lens)
    heads = head.nonzero().reshape(-1)
    start_q = cu.index_select(0, heads)
    extra = prefix.index_select(0, heads)  # the group's prompt when it is elsewhere in the row
    has = extra >= 0
    safe = extra.clamp(min=0)
    len_p = torch.where(has, lens.index_select(0, safe), torch.zeros_like(safe))
    start_p = cu.index_select(0, safe)
    lens_k = len_p + lens_q
    cu_q = _cu(lens_q).to(torch.int32)
    max_q, max_k, any_extra = torch.stack([lens_q.max(), lens_k.max(), has.any().to(torch.int64)]).tolist()
    if not any_extra:
        return SharedPromptLayout(cu_q, cu_q, None, int(max_q), int(max_q), total)
    # ranges (start, length) in key order: per group its prompt's, then its own
    starts = torch.stack([start_p, start_q], 1).reshape(-1)
    lengths = torch.stack([len_p, lens_q], 1).reshape(-1)
    out_start = _cu(lengths)[:-1]
    offsets = torch.repeat_interleave(starts - out_start, lengths)
    index_k = offsets + torch.arange(int(offsets.numel()), device=dev)
    return SharedPromptLayout(cu_q, _cu(lens_k).to(torch.int32), index_k, int(max_q), int(max_k), total)


def shared_prompt_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    prefix_segment: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    backend: str | AttentionBackend = "auto",
    window: tuple[int, int] | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    dropout: float = 0.0,
    layout: SharedPromptLayout | None = None,
) -> torch.Tensor:
    """Causal attention of `(tokens, heads, head_dim)` q/k/v in the shared-prompt layout (module docstring).

    Each sequence (prompt + chosen, prompt + rejected) gets exactly the attention it would get alone.
    `layout` (from `shared_prompt_layout`) lets the layers of one forward share the segments.
    Features as `varlen_attention`; a kernel that cannot align causal attention to the bottom right
    is passed over by `auto` and refused by name when forced.
    """
    from packtool.attention.varlen import varlen_attention

    if q.shape[0] != k.shape[0]:
        raise ConfigError(
            f"q has {q.shape[0]} tokens, k has {k.shape[0]}, {WHERE}, pass the packed row's q, k, v (no KV cache)"
        )
    lay = layout or shared_prompt_layout(cu_seqlens.to(q.device), prefix_segment)
    if lay.total != q.shape[0]:
        raise ConfigError(
            f"cu_seqlens covers {lay.total} tokens, q has {q.shape[0]}, {WHERE}, pass the batch's own cu_seqlens"
        )
    return varlen_attention(
        q,
        lay.gather(k),
        lay.gather(v),
        lay.cu_q,
        lay.max_q,
        causal=True,
        softmax_scale=softmax_scale,
        backend=backend,
        cu_seqlens_k=lay.cu_k,
        max_seqlen_k=lay.max_k,
        window=window,
        softcap=softcap,
        sinks=sinks,
        dropout=dropout,
        shared_prompt=True,
    )


def shared_prompt_ids(cu_seqlens: torch.Tensor, prefix_segment: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token of the row: (its segment, the segment of its prompt or -1), int32, for a mask_mod."""
    cu = cu_seqlens.reshape(-1).to(torch.int64)
    prefix = prefix_segment.reshape(-1).to(device=cu.device, dtype=torch.int64)
    check_prefix_segment(cu, prefix)
    lens = torch.diff(cu)
    seg = torch.repeat_interleave(torch.arange(lens.numel(), device=cu.device), lens)
    return seg.to(torch.int32), prefix.index_select(0, seg).to(torch.int32)


def shared_prompt_block_mask(
    cu_seqlens: torch.Tensor, prefix_segment: torch.Tensor, *, device: torch.device | str | None = None
) -> BlockMask:
    """A FlexAttention `BlockMask` for the shared-prompt layout: key j is visible from query i iff j <= i and
    j is in i's segment or in i's prompt (row order puts every prompt before its completions).

    Built with torch's `create_block_mask` (it evaluates the mask on every tile pair). Use it with
    `flex_varlen_attention(q, k, v, block_mask=...)`. Sliding windows are not in this mask (a window
    counts each sequence's own positions, not row distance): use `shared_prompt_attention` for them.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    dev = torch.device(device) if device is not None else cu_seqlens.device
    ids, prompts = shared_prompt_ids(cu_seqlens, prefix_segment)
    total = int(ids.numel())
    padded = -(-max(total, 1) // 128) * 128  # a kernel may look up positions past the end: they match nothing real
    seg = F.pad(ids, (0, padded - total), value=-1).to(dev)
    pre = F.pad(prompts, (0, padded - total), value=-2).to(dev)

    def shared_causal(b: Any, h: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        own = (seg[q_idx] == seg[kv_idx]) | (pre[q_idx] == seg[kv_idx])
        return own & (q_idx >= kv_idx)

    return create_block_mask(shared_causal, None, None, total, total, device=dev)
