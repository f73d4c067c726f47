"""Where the documents are in a transformers attention call: ONE reading of the batch, the same on every layer.

`read` is the one function that decides which layout a batch is, from every key the call carries:
the layer's mask (a 2-D padding mask, or `mask.py`'s int32 segment mask: the pattern transformers
built, with its padding, chunks, bidirectional blocks and window), `cu_seq_lens_q/_k` (+
`max_length_q/_k`), `seq_idx`, `position_ids` and a KV cache (more keys than queries). Every
combination is either read exactly, as each document alone under eager, or refused by name (a
`ConfigError` that says which keys disagree and what to pass instead). The table, in docs/HF.md:

- queries after a KV cache (decoding, a chunk): one sequence per row, unpadded by the 2-D mask,
  causal from the bottom right; `cu_seq_lens_*` there are refused, and so are queries after a cache that a
  packed forward filled (a row of several documents, marked on the layer: the continued document would see
  the others), and queries whose `position_ids` restart inside a row (a packed batch after a prefix cache, a
  packed prompt prefilled in chunks); `generate(use_cache=False)` re-reads a packed prompt at every step instead;
- otherwise (training, evaluation, a prefill) the documents come from the first key present of
  `cu_seq_lens_q` (which must equal `cu_seq_lens_k`), `seq_idx`, restarting `position_ids` (a document
  starts where the position is not the previous + 1), else each row is one document. A key that is
  also present must agree: `seq_idx` must change exactly where `cu_seq_lens` start a document, and
  `position_ids` must either never restart (row positions: `DataCollatorWithFlattening(
  return_position_ids=False)`) or restart exactly at those starts. A row always starts a document
  (a `cu_seq_lens`/`seq_idx` document across rows is refused: attention never crosses rows);
- padding (0 in the 2-D mask) is dropped from every document, wherever it is: the keys a token
  sees are those eager shows it. A hole inside a document (padding between two of its tokens) is
  exact on full-attention layers (the remaining keys are the same); on a sliding-window layer
  whose window is shorter than such a document, eager counts the window over the hole and a varlen
  kernel cannot, so that batch is refused by name;
- the layer's pattern adds what only it knows: chunk starts (Llama 4), bidirectional blocks (Gemma
  3's image tokens, never across documents), documents transformers found where the layer never
  sees `position_ids` (GPTBigCode, CTRL), and its window. A pattern that cuts a document the keys
  declare at places the keys do not, while missing the keys' own starts (chunks counted from the
  row, not the document), is refused;
- a batch with no real token returns zeros (as flash-attention gives padding), on every family.

The reading is computed once per forward and mask type (kept on the tensor that anchors it), so
layers that share a mask share it, and checked on the host once per forward.

Here: the dispatch and the segments of a forward whose queries are its keys (training, evaluation, a prefill).
`declared.py` reads each key's documents and refuses the keys that are malformed or disagree; `cached.py`
reads queries after a KV cache and refuses what cannot follow one; `shared_prompt.py` the shared-prompt layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from packtool.errors import ConfigError
from packtool.hf import shared_prompt
from packtool.hf.cached import after_cache
from packtool.hf.declared import check_lengths, declared, kept_starts
from packtool.hf.mask import SEGMENTS, WINDOW
from packtool.hf.rows import Blocks, Layout, Reading, cu_seqlens

_MEMO = "_packtool_reading"  # attribute of the tensor a forward's reading is kept on
_PACKED = "_packtool_packed"  # attribute of an attention layer: its last forward without a cache held packed rows
_READ = ("cu_seq_lens_q", "cu_seq_lens_k", "seq_idx", "position_ids", "max_length_q", "max_length_k", "lengths")
"""The call's keys a reading depends on (with the mask): the same objects give the same reading."""


@dataclass(frozen=True)
class _Plan:
    """The batch's segments over its `[B, T]` grid (no q/k/v): what a reading keeps per mask and keys."""

    index: torch.Tensor | None  # kept flat positions (None: every token)
    cu: torch.Tensor
    longest: int  # the longest segment, in kept tokens
    span: int  # the longest segment, from its first to its last token (holes included)
    hole_span: int  # the longest segment holding a hole (0: none)
    blocks: Blocks | None
    empty: bool
    packed: bool = False  # some row holds more than one declared document (a KV cache built from it mixes them)


def read(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    kwargs: dict[str, Any],
    sliding_window: int | None = None,
    *,
    prefix: Any = None,
    causal: bool = True,
    owner: Any = None,
) -> Reading:
    """THE reading of one attention call (`[B, T, heads, D]` q/k/v): see the module docstring.

    Layouts are added here and only here: a batch key that declares another layout gets its branch at the top
    of this function (the one dispatch point), and every other key must then agree with it or be refused.
    `prefix`: a preference batch's `prefix_segment` (popped from the call by `shared_prompt.pop`).
    `owner`: the attention layer; each forward whose queries are its keys marks on it whether a row held several
    documents (and a cache may be filled: not `use_cache=False`), so that queries after a KV cache that forward
    filled are refused.
    """
    if prefix is not None:
        _mark(
            owner, kwargs.get("use_cache") is not False
        )  # the shared-prompt layout: P/C/R segments of cu_seq_lens_q (hf/shared_prompt.py)
        rows = shared_prompt.from_prefix(q, k, v, mask, prefix, kwargs, causal)
        window = getattr(mask, WINDOW, sliding_window) if mask is not None else sliding_window
        left = int(window) - 1 if window is not None and 0 < int(window) < rows.max_k else None
        return Reading(rows, None, left)
    if mask is not None and mask.ndim != 2:
        raise ConfigError(
            f"attention_mask of shape {tuple(mask.shape)} reached attn_implementation='packtool', which takes the 2-D "
            "padding mask [batch, keys] only, packtool.hf, pass the 2-D mask (transformers builds the rest) or use "
            "attn_implementation='sdpa' for a custom 4-D mask"
        )
    b, tq = q.shape[:2]
    segmask = mask if mask is not None and mask.dtype == SEGMENTS else None
    width = k.shape[1]
    if segmask is not None:
        width = tq  # a static cache's prefill: the slots past the queries are empty (0 in the mask)
    elif mask is not None and mask.shape[1] != tq:
        used = int(mask.any(0).nonzero().max()) + 1 if bool(mask.any()) else 0  # a static cache's empty slots: 0
        mask = mask[:, : max(used, tq)] if used <= tq else mask[:, :used]
        width = mask.shape[1]
    if width != tq or (tq == 1 and k.shape[1] > 1 and mask is None):
        if getattr(owner, _PACKED, False):
            raise ConfigError(
                f"{tq} {'query' if tq == 1 else 'queries'} after a KV cache filled by a packed forward (a row of "
                "several documents: the cache holds them all, and a continued document would attend to the others), "
                "packtool.hf, generate or continue each document from its own prompt (one per row, padded), or pass "
                "use_cache=False with packed batches"
            )
        return after_cache(q, k, v, mask, kwargs, sliding_window)
    k, v = k[:, :tq], v[:, :tq]
    plan = _plan(b, tq, q.device, mask, kwargs)
    _mark(owner, plan.packed and kwargs.get("use_cache") is not False)  # use_cache=False: no cache is filled
    window = getattr(segmask, WINDOW, sliding_window) if segmask is not None else sliding_window
    left = None
    if window is not None and 0 < int(window) < plan.span:
        left = int(window) - 1
        if plan.hole_span > int(window):
            raise ConfigError(
                f"attention_mask has padding inside a document of {plan.hole_span} tokens on a sliding-window layer "
                f"(window {int(window)}): eager counts the window over the padding, a varlen kernel cannot, packtool.hf, "
                "pad on the left or right only (or between documents), or use attn_implementation='eager' for such masks"
            )
    if plan.empty:
        return Reading(None, None, left)
    flat_q, flat_k, flat_v = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v))
    if plan.index is not None:
        flat_q, flat_k, flat_v = (t.index_select(0, plan.index) for t in (flat_q, flat_k, flat_v))
    rows = Layout(flat_q, flat_k, flat_v, plan.cu, plan.cu, plan.longest, plan.longest, (b, tq), plan.index)
    return Reading(rows, plan.blocks, left)


def _mark(owner: Any, packed: bool) -> None:
    if owner is not None and getattr(owner, _PACKED, False) != packed:
        with contextlib.suppress(AttributeError, TypeError):
            setattr(owner, _PACKED, packed)


# ---------------------------------------------------------------------------------------------- training / prefill


def _plan(b: int, t: int, device: torch.device, mask: torch.Tensor | None, kwargs: dict[str, Any]) -> _Plan:
    """The segments of a forward whose queries are its keys, once per (mask, keys): kept on the anchor tensor."""
    keys = tuple(kwargs.get(name) for name in _READ)
    anchor = mask if mask is not None else next((x for x in keys if isinstance(x, torch.Tensor)), None)
    if anchor is None:  # plain rows: one document each
        cu = torch.arange(b + 1, dtype=torch.int32, device=device) * t
        return _Plan(None, cu, t, t, 0, None, b * t == 0)
    inputs = (mask, *keys)
    versions = _versions(inputs)
    memo = getattr(anchor, _MEMO, None)
    if (
        memo is not None
        and versions is not None
        and memo[1] == versions
        and all(a is c for a, c in zip(memo[0], inputs, strict=True))
    ):
        return memo[2]  # type: ignore[no-any-return]
    plan = _build(b, t, device, mask, kwargs)
    if versions is not None:
        with contextlib.suppress(AttributeError, RuntimeError):  # a tensor that takes no attribute: read per layer
            setattr(anchor, _MEMO, (inputs, versions, plan))
    return plan


def _versions(inputs: tuple[Any, ...]) -> tuple[int, ...] | None:
    """The in-place version of each tensor (a buffer refilled between steps is another batch), None where a tensor
    keeps none (inference mode): then nothing is kept and every layer reads the batch again."""
    try:
        return tuple(x._version if isinstance(x, torch.Tensor) else -1 for x in inputs)
    except RuntimeError:
        return None


def _build(b: int, t: int, device: torch.device, mask: torch.Tensor | None, kwargs: dict[str, Any]) -> _Plan:
    keep = pattern = joined = None
    if mask is not None:
        mask = mask[:, :t]
        if mask.shape != (b, t):
            raise ConfigError(
                f"attention_mask of shape {tuple(mask.shape)} for {b} rows of {t} tokens, packtool.hf, pass a "
                "[batch, tokens] mask"
            )
        if mask.dtype == SEGMENTS:
            keep = mask > 0
            pattern = kept_starts(mask >> 1, keep, numbered=True)
            joined = (mask & 1).bool()
        else:
            keep = mask.bool()
        if bool(keep.all()):
            keep = None
            if pattern is not None:
                pattern = kept_starts(mask >> 1, None, numbered=True)
    check_lengths(b, t, kwargs.get("lengths"), keep)
    docs, source = declared(b, t, device, kwargs, keep)
    packed = bool((docs & ~kept_starts(torch.zeros_like(docs), keep)).any())  # a row of several documents
    starts = docs
    if pattern is not None:
        extra, missed = (pattern & ~docs).any(), (docs & ~pattern).any()
        if all(torch.stack([extra, missed]).tolist()):
            raise ConfigError(
                f"the documents {source} declare are not the ones this layer's mask pattern cuts (chunked attention "
                "counted from the row's start, or documents transformers found in other position_ids), packtool.hf, "
                "pass position_ids that restart at every document (transformers then builds its pattern per document) "
                "and use_cache=False, or batch this model's documents padded (attention_mask)"
            )
        starts = docs | pattern
    return dataclasses.replace(_segments(starts, keep, joined), packed=packed)


def _segments(starts: torch.Tensor, keep: torch.Tensor | None, joined: torch.Tensor | None) -> _Plan:
    """The varlen segments of the kept tokens' document starts (`kept_starts`), their spans and holes, and the
    bidirectional blocks of `joined` (a token joined to the next one, within its document only)."""
    b, t = starts.shape
    dev = starts.device
    index = None if keep is None else keep.reshape(-1).nonzero().reshape(-1)
    first = starts.reshape(-1) if index is None else starts.reshape(-1).index_select(0, index)
    n = int(first.numel())
    if n == 0:
        return _Plan(index, torch.zeros(1, dtype=torch.int32, device=dev), 0, 0, 0, None, True)
    begins = first.nonzero().reshape(-1)
    cu = torch.cat([begins, torch.tensor([n], device=dev, dtype=begins.dtype)]).to(torch.int32)
    lens = torch.diff(cu).long()
    span, hole_span = lens, torch.zeros((), dtype=torch.long, device=dev)
    if index is not None:  # padding dropped: a document's span counts its holes too
        span = index.index_select(0, cu[1:].long() - 1) - index.index_select(0, cu[:-1].long()) + 1
        gap = (index[1:] - index[:-1] > 1) & ~first[1:]
        holed = torch.zeros(lens.numel(), dtype=torch.bool, device=dev)
        holed[(torch.cumsum(first.long(), 0) - 1)[1:][gap]] = True
        hole_span = torch.where(holed, span, 0).max()
    longest, widest, holes = torch.stack([lens.max(), span.max(), hole_span]).tolist()  # one sync
    blocks = None
    if joined is not None:
        ends = torch.ones(b, t, dtype=torch.bool, device=dev)  # the next token starts a document, or is padding
        ends[:, :-1] = starts[:, 1:] | (False if keep is None else ~keep[:, 1:])
        link = (joined & ~ends).reshape(-1)
        link = link if index is None else link.index_select(0, index)
        if bool(link.any()):
            blocks = _blocks(link, first, cu)
    if index is not None and n == b * t:
        index = None
    return _Plan(index, cu, int(longest), int(widest), int(holes), blocks, False)


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
    return Blocks(index_q, index_k, cu_seqlens(lens_q.to(torch.int32)), cu_seqlens(lens_k.to(torch.int32)),
                  int(lens_q.max()), int(lens_k.max()))  # fmt: skip
