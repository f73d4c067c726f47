"""The documents an attention call's keys declare, each key read and checked: `cu_seq_lens_q/_k` (+ `max_length_q/_k`),
`seq_idx`, `position_ids`, and `PaddedCollator`'s `lengths` against the mask.

`layout.read` takes the documents from the first key present and every other key must agree with it; a key that
is malformed (not offsets, the wrong shape, a document across rows) or disagrees is refused here, by name, with
the batch's own words for what is wrong (see `layout.py`'s docstring for the table). Also the one rule for where a
document starts among the kept (non-padding) tokens, `kept_starts`, which the cache layout (`cached.py`) shares.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from packtool.errors import ConfigError


def check_lengths(b: int, t: int, lengths: Any, keep: torch.Tensor | None) -> None:
    """`PaddedCollator`'s `lengths` (real tokens per row) must be what the mask keeps: else the mask is not its own."""
    if lengths is None:
        return
    real = keep.sum(-1) if keep is not None else torch.full((b,), t)
    if not isinstance(lengths, torch.Tensor) or lengths.shape != (b,) or not torch.equal(lengths.to(real), real):
        raise ConfigError(
            f"lengths {getattr(lengths, 'tolist', lambda: lengths)()} disagree with the attention_mask's real tokens "
            f"per row {real.tolist()}, packtool.hf, pass PaddedCollator's batch whole (its attention_mask with it)"
        )


def kept_starts(starts: torch.Tensor, keep: torch.Tensor | None, numbered: bool = False) -> torch.Tensor:
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


def declared(
    b: int, t: int, device: torch.device, kwargs: dict[str, Any], keep: torch.Tensor | None
) -> tuple[torch.Tensor, str]:
    """bool `[B, T]`: the kept tokens that start a document, from the first of cu_seq_lens / seq_idx / position_ids,
    the others checked against it (see the module docstring); with the name of the key that declared them."""
    found = [
        (starts, name)
        for starts, name in (
            (_cu_starts(b, t, device, kwargs), "cu_seq_lens_q"),
            (_seq_starts(b, t, device, kwargs.get("seq_idx")), "seq_idx"),
            (position_starts(b, t, device, kwargs.get("position_ids")), "position_ids"),
        )
        if starts is not None
    ]
    if not found:
        rows = torch.zeros(b, t, dtype=torch.bool, device=device)
        rows[:, 0] = True
        return kept_starts(rows, keep), "the rows"
    docs, source = kept_starts(found[0][0], keep), found[0][1]
    first = kept_starts(torch.zeros_like(docs), keep)  # each row's first kept token
    for starts, name in found[1:]:
        other = kept_starts(starts, keep)
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


def position_starts(b: int, t: int, device: torch.device, position_ids: Any) -> torch.Tensor | None:
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
