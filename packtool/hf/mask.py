"""The attention mask transformers builds for `attn_implementation="packtool"`: flash-attention's, plus segments.

transformers prepares each layer's mask through `masking_utils.AttentionMaskInterface`, keyed by
the implementation name; a name it does not know gets NO mask at all (so a padded batch would
attend to its padding). "packtool", like flash-attention, takes the 2-D padding mask, sliced to
the layer's keys, or None: the 4-D float mask of sdpa/eager would materialise T×T per layer,
which is what varlen kernels avoid.

Unlike flash-attention's, it also reads the model's mask pattern (`mask_function`) where the
padding mask cannot say it, at three keys per query (O(B·T), once per forward and mask type):
- key i-1 hidden from query i: a segment starts at i. transformers hides it where restarting
  `position_ids` start a document (packed detection, which works even for models that never
  hand `position_ids` to the attention function: CTRL, GPTBigCode, Persimmon, Moshi) and where
  a chunk of chunked attention starts (Llama 4's `attention_chunk_size`);
- key i+1 visible from query i: a bidirectional block (Gemma 3's image tokens) joins i and i+1;
- the first key of its segment hidden from query i: a sliding window, of the nearest such distance
  (for the models that declare their window in the mask only: Qwen2-MoE, PhiMoE).
Then the mask is an int32 `[B, T]` of `2 * segment + joined_with_next` (0: a padding token),
which `layout.from_segments` turns into varlen segments. Decoding one token after a KV cache,
the mask is the row of keys the query may see (chunks, a static cache's empty slots), so every
pattern transformers builds for a decoder is honoured, or refused by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from packtool.errors import ConfigError
from packtool.hf.features import chunks_follow_documents, misphased_chunks, refuse_config

SEGMENTS = torch.int32
"""dtype of a segment mask (`2 * segment + joined_with_next`, 0 = padding); a bool mask is padding only."""
WINDOW = "packtool_window"
"""Attribute of a segment mask: the sliding window (in keys, the query's own included) its pattern shows."""


@torch.compiler.disable  # host-side reading of the pattern (a sync per mask): runs eagerly under torch.compile
def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """`[B, kv_length]` bool (True = a real key), an int32 segment mask (see the module docstring), or None."""
    config = kwargs.get("config")
    if config is not None:
        refuse_config(config)
    device = kwargs.get("device")
    if device is None:
        device = attention_mask.device if attention_mask is not None else "cpu"
    pad = _padding(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask, device)
    if mask_function is None:
        return pad
    use_vmap = bool(kwargs.get("use_vmap"))
    if q_length == 1:  # decoding: the keys this query may see, exactly
        rows = torch.arange(batch_size, device=device)[:, None]
        keys = torch.arange(kv_length, device=device)[None, :] + kv_offset
        query = torch.as_tensor(q_offset, device=device).reshape(1, 1).expand(1, kv_length)
        seen = _evaluate(mask_function, rows, query, keys, use_vmap).expand(batch_size, kv_length)
        if pad is not None:  # a static cache: the slots past the mask are empty
            seen = seen & F.pad(pad, (0, kv_length - pad.shape[1]))
        return None if bool(seen.all()) else seen
    if isinstance(q_offset, torch.Tensor) or q_offset != 0 or kv_offset != 0 or q_length > kv_length:
        return pad  # a chunk after a cache: the padding mask, causal from the bottom right (layout.from_mask)
    chunk = getattr(config, "attention_chunk_size", None) if attention_mask is None else None
    if chunk and chunks_follow_documents():
        chunk = None  # this transformers chunks each packed document from its own start
    return _segments(mask_function, batch_size, q_length, kv_length, pad, device, use_vmap, chunk)


def _padding(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor,
    kv_offset: int,
    attention_mask: torch.Tensor | None,
    device: Any,
) -> torch.Tensor | None:
    """flash-attention's mask: the 2-D padding mask sliced to the layer's keys, None when every key is real.

    One case flash-attention leaves to `generate` (which keeps the mask for flash names only): a static
    KV cache whose slots exceed the tokens seen gets a mask of the slots filled. A mask shorter than the
    keys (a static cache's prefill) stays short: `layout.from_mask` attends to the keys it covers.
    """
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:].bool()  # a sliding-window cache keeps the last keys
        if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
            return None
        return attention_mask
    seen = q_offset + q_length - kv_offset  # keys written so far (a static cache has kv_length slots)
    if isinstance(seen, int) and seen >= kv_length:
        return None
    slots = torch.arange(kv_length, device=device)
    return (slots < seen).expand(batch_size, kv_length)


def _segments(
    mask_function: Callable[..., Any],
    batch_size: int,
    q_length: int,
    kv_length: int,
    pad: torch.Tensor | None,
    device: Any,
    use_vmap: bool,
    chunk: int | None = None,
) -> torch.Tensor | None:
    """The segment mask of a prefill / training forward (queries are keys 0..q_length-1), or `pad` when plain.

    `chunk`: the model's chunk size where this transformers chunks a packed row by its row positions, to refuse
    a chunked layer whose packed documents would not get their own chunks (`features.misphased_chunks`).

    A third look: can each query still see the first key of its segment? Where a sliding window hides it,
    the nearest such query gives the window (`WINDOW` on the mask), for models that put their window in the
    mask only and never pass `sliding_window` to the attention function (Qwen2-MoE, PhiMoE).
    """
    if q_length < 2:
        return pad
    rows = torch.arange(batch_size, device=device)[:, None]
    i = torch.arange(1, q_length, device=device)[None, :]
    back = _evaluate(mask_function, rows, i, i - 1, use_vmap).expand(batch_size, q_length - 1)
    ahead = _evaluate(mask_function, rows, i - 1, i, use_vmap).expand(batch_size, q_length - 1)
    start = torch.ones(batch_size, q_length, dtype=torch.bool, device=device)
    start[:, 1:] = ~back
    if chunk and int(chunk) > 0 and (refusal := misphased_chunks(int(chunk), start)) is not None:
        raise refusal
    positions = torch.arange(q_length, device=device).expand(batch_size, q_length)
    first = torch.cummax(torch.where(start, positions, 0), -1).values  # each query's segment start
    hidden = ~_evaluate(mask_function, rows, positions, first, use_vmap).expand(batch_size, q_length)
    far = torch.where(hidden, positions - first, q_length)  # q_length: no window seen
    overlay = _overlay_blocks(mask_function)
    if overlay is not None:  # image blocks by their row-global ids, not as the composed function reads them packed
        ids = overlay[:, :q_length].to(device)
        ahead = ((ids[:, :-1] == ids[:, 1:]) & (ids[:, :-1] >= 0)).expand(batch_size, q_length - 1)
    cut, blocks, nearest = torch.stack([start[:, 1:].any().long(), ahead.any().long(), far.min()]).tolist()  # one sync
    window = int(nearest) if nearest < q_length else None
    if not cut and not blocks and window is None:
        return pad
    joined = torch.zeros(batch_size, kv_length, dtype=SEGMENTS, device=device)
    joined[:, : q_length - 1] = (ahead & back).to(SEGMENTS)  # within a segment only
    segment = torch.zeros(batch_size, kv_length, dtype=SEGMENTS, device=device)
    segment[:, :q_length] = start.to(SEGMENTS).cumsum(-1, dtype=SEGMENTS)
    ids = 2 * segment + joined
    if pad is not None:
        ids = ids * F.pad(pad, (0, kv_length - pad.shape[1])).to(SEGMENTS)
    if window is not None:
        setattr(ids, WINDOW, window)
    return ids


def _overlay_blocks(fn: Callable[..., Any]) -> torch.Tensor | None:
    """The `block_sequence_ids` of transformers' `blockwise_overlay` (Gemma 3's image blocks) inside a composed
    mask function, or None.

    Why: where transformers detects packed documents from restarting `position_ids`, it remaps every index to
    its document-local position before calling the functions it composed, and a blockwise overlay passed as an
    `or_mask_function` (Gemma 3's sliding layers) then reads the ROW's block ids at document-local indices: the
    second document's tokens take the first document's image layout (a token before an image sees the image;
    measured 0.27 off the document alone on a tiny Gemma 3, under eager too). The ids themselves are row-global,
    so the blocks are read from them: two neighbours are joined when they share a block id >= 0.
    """
    stack: list[Any] = [fn]
    seen: set[int] = set()
    found: list[torch.Tensor] = []
    while stack:
        f = stack.pop()
        if id(f) in seen or not callable(f):
            continue
        seen.add(id(f))
        code = getattr(f, "__code__", None)
        cells = getattr(f, "__closure__", None) or ()
        names = code.co_freevars if code is not None else ()
        for name, cell in zip(names, cells, strict=False):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if name == "block_sequence_ids" and getattr(f, "__qualname__", "").startswith("blockwise_overlay."):
                if isinstance(value, torch.Tensor):
                    found.append(value)
            elif callable(value):
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(v for v in value if callable(v))
    if not found:
        return None
    first = found[0]
    for other in found[1:]:
        width = min(first.shape[-1], other.shape[-1])
        if other.shape[0] != first.shape[0] or not bool((other[:, :width] == first[:, :width]).all()):
            raise ConfigError(
                "a mask composes two different blockwise overlays, packtool.hf, "
                "pass one set of token_type_ids (image blocks) per forward"
            )
    return first


def _evaluate(
    fn: Callable[..., Any], rows: torch.Tensor, q: torch.Tensor, k: torch.Tensor, use_vmap: bool
) -> torch.Tensor:
    """`fn(batch, head 0, q, k)` elementwise over broadcast index tensors: bool, shaped like `q` broadcast with rows."""
    shape = torch.broadcast_shapes(rows.shape, q.shape, k.shape)
    if not use_vmap:
        try:
            out = fn(rows, torch.zeros((), dtype=torch.long, device=q.device), q, k)
            return torch.as_tensor(out, device=q.device).bool().expand(shape)
        except Exception:  # noqa: BLE001 - a pattern that is not index-based: evaluate it pair by pair below
            pass
    from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex

    b, qq, kk = (t.expand(shape).reshape(-1) for t in (rows, q, k))
    head = torch.zeros_like(b)
    with TransformGetItemToIndex():
        out = torch.vmap(fn)(b, head, qq, kk)
    return out.bool().reshape(shape)
