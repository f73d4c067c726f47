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
from packtool.hf.mask import SEGMENTS, WINDOW
from packtool.hf.rows import Blocks, Layout, Reading

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
        return _after_cache(q, k, v, mask, kwargs, sliding_window)
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
            pattern = _kept_starts(mask >> 1, keep, numbered=True)
            joined = (mask & 1).bool()
        else:
            keep = mask.bool()
        if bool(keep.all()):
            keep = None
            if pattern is not None:
                pattern = _kept_starts(mask >> 1, None, numbered=True)
    _check_lengths(b, t, kwargs.get("lengths"), keep)
    docs, source = _declared(b, t, device, kwargs, keep)
    packed = bool((docs & ~_kept_starts(torch.zeros_like(docs), keep)).any())  # a row of several documents
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


def _check_lengths(b: int, t: int, lengths: Any, keep: torch.Tensor | None) -> None:
    """`PaddedCollator`'s `lengths` (real tokens per row) must be what the mask keeps: else the mask is not its own."""
    if lengths is None:
        return
    real = keep.sum(-1) if keep is not None else torch.full((b,), t)
    if not isinstance(lengths, torch.Tensor) or lengths.shape != (b,) or not torch.equal(lengths.to(real), real):
        raise ConfigError(
            f"lengths {getattr(lengths, 'tolist', lambda: lengths)()} disagree with the attention_mask's real tokens "
            f"per row {real.tolist()}, packtool.hf, pass PaddedCollator's batch whole (its attention_mask with it)"
        )


def _kept_starts(starts: torch.Tensor, keep: torch.Tensor | None, numbered: bool = False) -> torch.Tensor:
    """bool `[B, T]`: the kept tokens that start a document, from starts anywhere (or, `numbered`, segment numbers).

    A start on a padding token passes to the next kept token, and a row's first kept token starts one: the
    documents of the kept tokens, which is all attention sees.
    """
    b, t = starts.shape
    segment = starts if numbered else torch.cumsum(starts.to(torch.int32), -1)
    if keep is None:
        out = torch.ones(b, t, dtype=torch.bool, device=starts.device)
        out[:, 1:] = segment[:, 1:] != segment[:, :-1]
        return out
    col = torch.arange(t, device=starts.device).expand(b, t)
    last = torch.cummax(torch.where(keep, col, -1), -1).values  # the latest kept column at or before each token
    prev = F.pad(last[:, :-1], (1, 0), value=-1)
    before = segment.gather(1, prev.clamp(min=0))
    return keep & ((prev < 0) | (before != segment))


def _declared(
    b: int, t: int, device: torch.device, kwargs: dict[str, Any], keep: torch.Tensor | None
) -> tuple[torch.Tensor, str]:
    """bool `[B, T]`: the kept tokens that start a document, from the first of cu_seq_lens / seq_idx / position_ids,
    the others checked against it (see the module docstring); with the name of the key that declared them."""
    found = [
        (starts, name)
        for starts, name in (
            (_cu_starts(b, t, device, kwargs), "cu_seq_lens_q"),
            (_seq_starts(b, t, device, kwargs.get("seq_idx")), "seq_idx"),
            (_position_starts(b, t, device, kwargs.get("position_ids")), "position_ids"),
        )
        if starts is not None
    ]
    if not found:
        rows = torch.zeros(b, t, dtype=torch.bool, device=device)
        rows[:, 0] = True
        return _kept_starts(rows, keep), "the rows"
    docs, source = _kept_starts(found[0][0], keep), found[0][1]
    first = _kept_starts(torch.zeros_like(docs), keep)  # each row's first kept token
    for starts, name in found[1:]:
        other = _kept_starts(starts, keep)
        if name == "position_ids" and not bool((other & ~first).any()):
            continue  # positions that never restart say nothing (the model's own row positions)
        if not torch.equal(other, docs):
            row, col = (other != docs).nonzero()[0].tolist()
            says = bool(other[row, col])
            raise ConfigError(
                f"{name} and {source} disagree: {name} {'starts' if says else 'does not start'} a document at row "
                f"{row}, token {col}, where {source} {'does not' if says else 'does'}, packtool.hf, pass keys from one "
                f"collator ({name} restarting exactly where {source} starts each document), or drop {name}"
            )
    return docs, source


def _cu_starts(b: int, t: int, device: torch.device, kwargs: dict[str, Any]) -> torch.Tensor | None:
    """bool `[B, T]` document starts from `cu_seq_lens_q` (checked: the batch's own words for what is wrong)."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None:
        if cu_k is not None:
            raise ConfigError("cu_seq_lens_k without cu_seq_lens_q, packtool.hf, pass both (the same offsets)")
        return None
    cu = _offsets(cu_q, "cu_seq_lens_q")
    if cu_k is not None and cu_k is not cu_q:
        other = _offsets(cu_k, "cu_seq_lens_k")
        if other.shape != cu.shape or not torch.equal(other.to(cu.device), cu):
            raise ConfigError(
                "cu_seq_lens_k differ from cu_seq_lens_q in a forward whose queries are its keys, packtool.hf, "
                "pass the same offsets for both"
            )
    total = b * t
    host = cu.detach().to("cpu", torch.int64)
    steps = torch.diff(host)
    if int(host[0]) != 0 or int(host[-1]) != total:
        raise ConfigError(
            f"cu_seq_lens_q runs from {int(host[0])} to {int(host[-1])}, the batch holds {b} x {t} = {total} tokens "
            "(padding included: packtool.hf reads the offsets over the flattened batch), packtool.hf, pass offsets "
            "from 0 to the batch's token count (PackedCollator(keys=HF_KEYS), DataCollatorWithFlattening(return_flash_"
            "attn_kwargs=True)), or no cu_seq_lens with a context-parallel shard"
        )
    if bool((steps < 0).any()):
        at = int((steps < 0).nonzero()[0])
        raise ConfigError(
            f"cu_seq_lens_q decreases at entry {at + 1} ({int(host[at])} -> {int(host[at + 1])}) in the batch passed "
            "to the model, packtool.hf, pass non-decreasing offsets (build the batch with PackedCollator(keys=HF_KEYS) "
            "or DataCollatorWithFlattening(return_flash_attn_kwargs=True))"
        )
    longest = int(steps.max()) if steps.numel() else 0
    for name in ("max_length_q", "max_length_k"):
        given = kwargs.get(name)
        if given is not None and int(given) < longest:
            raise ConfigError(
                f"{name}={int(given)} is below the longest document in cu_seq_lens_q ({longest} tokens), packtool.hf, "
                "pass the true maximum (kernels would read out of bounds)"
            )
    start = torch.zeros(total, dtype=torch.bool)
    inner = host[:-1][steps > 0]
    start[inner] = True
    start = start.view(b, t)
    if not bool(start[:, 0].all()):
        row = int((~start[:, 0]).nonzero()[0])
        raise ConfigError(
            f"cu_seq_lens_q put a document across rows {row - 1} and {row} of the batch ([{b}, {t}]), packtool.hf, "
            "start a document at every row (attention never crosses rows), or flatten the batch to one row"
        )
    return start.to(device)


def _offsets(cu: Any, name: str) -> torch.Tensor:
    if not isinstance(cu, torch.Tensor) or cu.is_floating_point() or cu.is_complex() or cu.numel() < 1:
        raise ConfigError(
            f"{name} must be an integer tensor of offsets, got {type(cu).__name__}"
            f"{' of ' + str(cu.dtype) if isinstance(cu, torch.Tensor) else ''}, packtool.hf, pass int32 offsets"
        )
    if cu.ndim > 1 and max(cu.shape[:-1]) > 1:
        raise ConfigError(
            f"{name} of shape {tuple(cu.shape)}, packtool.hf, pass one 1-D tensor of offsets over the flattened batch"
        )
    return cu.reshape(-1)


def _seq_starts(b: int, t: int, device: torch.device, seq_idx: Any) -> torch.Tensor | None:
    if seq_idx is None:
        return None
    if not isinstance(seq_idx, torch.Tensor) or seq_idx.numel() != b * t:
        shape = tuple(getattr(seq_idx, "shape", ()))
        raise ConfigError(
            f"seq_idx of shape {shape} for {b} rows of {t} tokens, packtool.hf, pass one index per token (shaped like "
            "input_ids)"
        )
    flat = seq_idx.reshape(-1).to(device)
    start = torch.ones(b * t, dtype=torch.bool, device=device)
    start[1:] = flat[1:] != flat[:-1]
    start = start.view(b, t)
    if b > 1 and not bool(start[:, 0].all()):
        row = int((~start[:, 0]).nonzero()[0])
        raise ConfigError(
            f"seq_idx puts a document across rows {row - 1} and {row} of the batch ([{b}, {t}]), packtool.hf, "
            "number each row's documents apart (attention never crosses rows)"
        )
    return start


def _position_starts(b: int, t: int, device: torch.device, position_ids: Any) -> torch.Tensor | None:
    if position_ids is None:
        return None
    pos = position_ids
    if pos.ndim == 1:
        pos = pos[None]
    if pos.ndim == 3:  # multimodal RoPE: image tokens repeat positions, so restarts say nothing
        return None
    if pos.ndim != 2 or pos.shape[-1] != t or pos.shape[0] not in (1, b):
        raise ConfigError(
            f"position_ids of shape {tuple(position_ids.shape)} for {b} rows of {t} tokens, packtool.hf, pass "
            "[batch, tokens] position_ids, or cu_seq_lens_q/_k for packed documents"
        )
    pos = pos.to(device).expand(b, t)
    start = torch.ones(b, t, dtype=torch.bool, device=device)
    start[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    return start


def _segments(starts: torch.Tensor, keep: torch.Tensor | None, joined: torch.Tensor | None) -> _Plan:
    """The varlen segments of the kept tokens' document starts (`_kept_starts`), their spans and holes, and the
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
    return Blocks(index_q, index_k, _cu(lens_q.to(torch.int32)), _cu(lens_k.to(torch.int32)),
                  int(lens_q.max()), int(lens_k.max()))  # fmt: skip


# ---------------------------------------------------------------------------------------------- after a KV cache


def _cu(lengths: torch.Tensor) -> torch.Tensor:
    return F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))


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
        found.append(("position_ids", _position_starts(b, tq, device, pos)))
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
        extra = _kept_starts(starts, keep) & ~_kept_starts(torch.zeros_like(starts), keep)
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


def _after_cache(
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
    cu_k = _cu(lens_k)
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
        cu_q, max_q = _cu(lens_q), int(lens_q.max())
    flat_q = q.reshape(-1, *q.shape[2:]).index_select(0, index_q)
    if int(max_k) == 0:
        return Reading(None, None, window)
    return Reading(Layout(flat_q, flat_k, flat_v, cu_q, cu_k, max_q, int(max_k), (b, tq), index_q), None, window)
