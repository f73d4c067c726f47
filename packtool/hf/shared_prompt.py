"""The shared-prompt layout (`pack --share-prompt`) through `attn_implementation="packtool"`.

A preference batch from `PackedCollator(keys=HF_KEYS)` on a shared-prompt pack store carries
`prefix_segment` (one int per segment of `cu_seq_lens_q`: the index of the prompt segment a
completion continues from, -1 elsewhere). transformers (5.x) hands every extra `model(**batch)`
keyword to each attention call, so the door sees it there and attends each completion to its
prompt and itself (`packtool.attention.shared_prompt`), with positions as each sequence alone
(the collator's `position_ids`: P = 0..p-1, C and R = p..).

Only "packtool" reads `prefix_segment`. Under `eager`, `sdpa` or `flash_attention_2` a shared
batch runs WRONG without a word (they find documents from restarting positions: the rejected
completion would not see its prompt), so: run shared batches under "packtool" only; the door
marks the `prefix_segment` tensor it attended with, and `packtool.loss.pair_logps` refuses a
shared batch whose `prefix_segment` no "packtool" layer saw.

Refused by name: a shared batch without `cu_seq_lens_q`, with a padding mask, with a KV cache
(generation), or in a non-causal layer or one with bidirectional blocks.
"""

from __future__ import annotations

from typing import Any

import torch

from packtool.attention.shared_prompt import SharedPromptLayout, shared_prompt_layout
from packtool.errors import ConfigError
from packtool.hf.mask import SEGMENTS
from packtool.hf.rows import Layout

KEY = "prefix_segment"
"""The batch key (and attention keyword) that carries the shared-prompt layout."""
SEEN = "_packtool_shared_prompt"
"""Attribute set on a `prefix_segment` tensor once a "packtool" attention layer attended with it."""
_CACHE = "_packtool_shared_layout"
_BLOCKS = "_packtool_has_blocks"
PAIR_KEYS = ("pair_ids", "chosen")
"""Preference batch keys that change nothing in attention: a whole batch may go to `model(**batch)`."""
WHERE = "packtool.hf (shared-prompt batch)"


def pop(kwargs: dict[str, Any]) -> Any:
    """Take the preference keys out of an attention call's kwargs; returns its `prefix_segment` (or None)."""
    for key in PAIR_KEYS:
        kwargs.pop(key, None)
    return kwargs.pop(KEY, None)


def _refuse(what: str, fix: str) -> ConfigError:
    return ConfigError(f"{what}, {WHERE}, {fix}")


def check_positions(cu: torch.Tensor, prefix: torch.Tensor, position_ids: torch.Tensor | None) -> None:
    """Raise unless each completion's first position continues its prompt's last (each sequence as if alone)."""
    if position_ids is None or position_ids.ndim == 3:
        return
    pos = position_ids.reshape(-1).to(cu.device)
    if pos.numel() != int(cu[-1]):
        return
    lens = torch.diff(cu.to(torch.int64))
    done = (prefix >= 0) & (lens > 0)
    if not bool(done.any()):
        return
    seg = done.nonzero().reshape(-1)
    pre = prefix.index_select(0, seg)
    first = pos.index_select(0, cu.index_select(0, seg).to(torch.int64))
    pre_len = lens.index_select(0, pre)
    last = torch.where(pre_len > 0, pos.index_select(0, (cu.index_select(0, pre + 1) - 1).clamp(min=0)), -1)
    if not bool(torch.equal(first, last + 1)):
        raise _refuse(
            "position_ids do not continue each completion from its prompt (a completion's first position must be "
            "its prompt's last + 1, as if each sequence ran alone)",
            "pass the collator's position_ids for a --share-prompt pack store",
        )


def layout_for(
    cu: torch.Tensor, prefix: torch.Tensor, position_ids: torch.Tensor | None, cu_k: torch.Tensor | None = None
) -> SharedPromptLayout:
    """The shared layout of a batch, computed and checked once per forward (the layers hand the same tensors),
    kept on the `prefix_segment` tensor."""
    cached = getattr(prefix, _CACHE, None)
    if cached is not None and cached[0] is cu and cached[1] is position_ids and cached[2] is cu_k:
        return cached[3]  # type: ignore[no-any-return]
    flat_cu = cu.reshape(-1)
    if cu_k is not None and cu_k is not cu and not torch.equal(cu_k.reshape(-1).to(flat_cu), flat_cu):
        raise _refuse("cu_seq_lens_k differs from cu_seq_lens_q", "pass the collator's cu_seq_lens_q/_k (equal)")
    flat = prefix.reshape(-1).to(device=cu.device, dtype=torch.int64)
    lay = shared_prompt_layout(flat_cu, flat)
    check_positions(flat_cu.to(torch.int64), flat, position_ids)
    setattr(prefix, _CACHE, (cu, position_ids, cu_k, lay))
    return lay


def from_prefix(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention_mask: torch.Tensor | None,
    prefix: torch.Tensor,
    kwargs: dict[str, Any],
    causal: bool,
) -> Layout:
    """`[B, T, H, D]` q/k/v of a shared-prompt batch -> varlen rows (queries in order, keys gathered)."""
    if not isinstance(prefix, torch.Tensor):
        raise _refuse(f"prefix_segment is a {type(prefix).__name__}", "pass the collator's int64 tensor")
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        raise _refuse(
            "prefix_segment reached a layer without cu_seq_lens_q (the P/C/R segments it indexes)",
            "pass the whole PackedCollator(keys=HF_KEYS) batch to model(**batch)",
        )
    if q.shape[1] != k.shape[1]:
        raise _refuse(
            f"{q.shape[1]} queries against {k.shape[1]} keys (a KV cache)",
            "run shared-prompt batches with use_cache=False (training / scoring), not generate",
        )
    if not causal:
        raise _refuse("a non-causal layer", "the shared-prompt layout is for causal decoders")
    if attention_mask is not None:
        if attention_mask.dtype != SEGMENTS:
            raise _refuse(
                "a padding attention_mask", "pass the packed batch without attention_mask (PackedCollator's HF_KEYS)"
            )
        blocks = getattr(attention_mask, _BLOCKS, None)
        if blocks is None:  # once per mask: the layers sharing it pay one check
            blocks = bool((attention_mask & 1).any())
            setattr(attention_mask, _BLOCKS, blocks)
        if blocks:
            raise _refuse("a layer with bidirectional blocks (image tokens)", "pack this model's data unshared")
    lay = layout_for(cu, prefix, kwargs.get("position_ids"), kwargs.get("cu_seq_lens_k"))
    b, t = q.shape[:2]
    if lay.total != b * t:
        raise _refuse(
            f"cu_seq_lens_q covers {lay.total} tokens, the batch has {b * t}", "pass the batch's own cu_seq_lens_q"
        )
    setattr(prefix, SEEN, True)
    flat_q, flat_k, flat_v = (x.reshape(-1, *x.shape[2:]) for x in (q, k, v))
    return Layout(flat_q, lay.gather(flat_k), lay.gather(flat_v), lay.cu_q, lay.cu_k, lay.max_q, lay.max_k, (b, t))


def guard_causal_lm_loss() -> None:
    """Make `model(**batch)` with `labels` score a shared-prompt batch right (once per process).

    transformers' causal-LM loss shifts the row by one: in the shared layout it would score the
    rejected completion's first token from the chosen completion's last logit, a wrong loss that looks
    right. Its loss function gets every extra keyword of `model(**batch)`, `prefix_segment` and
    `cu_seq_lens_q` included, so the wrapper scores such a batch with
    `packtool.loss.packed_cross_entropy(..., prefix_segment=)` (each completion's first token from its
    prompt's last logit: each sequence alone), as a token mean or, with `num_items_in_batch`, a sum over
    it; it refuses one it cannot score (no `cu_seq_lens_q`, or `shift_labels`). Other batches: unchanged.
    """
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING
    except ImportError:  # a transformers without the mapping: nothing to guard
        return
    inner: Any = LOSS_MAPPING.get("ForCausalLM")
    if inner is None or getattr(inner, "_packtool_guarded", False):
        return

    def loss(
        logits: torch.Tensor,
        labels: torch.Tensor,
        vocab_size: int,
        num_items_in_batch: Any = None,
        ignore_index: int = -100,
        shift_labels: Any = None,
        **kwargs: Any,
    ) -> Any:
        prefix = kwargs.get(KEY)
        if not (isinstance(prefix, torch.Tensor) and bool((prefix >= 0).any())):
            return inner(logits, labels, vocab_size, num_items_in_batch, ignore_index, shift_labels, **kwargs)
        if not getattr(prefix, SEEN, False):
            raise _refuse(
                "model(**batch) got labels with a shared-prompt prefix_segment that no attn_implementation='packtool' "
                "layer attended with (eager, sdpa and flash_attention_2 ignore it: the rejected completion would "
                "not see its prompt)",
                "load the model with attn_implementation='packtool' (import packtool.hf)",
            )
        cu = kwargs.get("cu_seq_lens_q")
        if cu is None or shift_labels is not None:
            raise _refuse(
                "model(**batch) got labels with a shared-prompt prefix_segment but "
                + ("shift_labels" if shift_labels is not None else "no cu_seq_lens_q"),
                "pass the collator's batch (keys=HF_KEYS), or keep labels out of model() and use "
                "packtool.loss.pair_logps / packed_cross_entropy(..., prefix_segment=...)",
            )
        from packtool.loss import packed_cross_entropy

        reduction = "token" if num_items_in_batch is None else "sum"
        out = packed_cross_entropy(
            logits.float(), labels, cu, reduction, ignore_index=ignore_index, prefix_segment=prefix
        )
        if num_items_in_batch is not None:
            out = out / torch.as_tensor(num_items_in_batch).to(out.device)
        return out

    loss._packtool_guarded = True  # type: ignore[attr-defined]
    LOSS_MAPPING["ForCausalLM"] = loss
