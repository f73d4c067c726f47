"""`PackedCollator`: packs (or documents) -> one batch with every varlen kwarg frameworks want.

Varlen kernels (flash-attn, Transformer Engine) trust `cu_seqlens` blindly: a non-monotone
array or a `max_seqlen` below a segment's length silently computes wrong attention. So every
batch is checked here, on CPU, before it reaches the GPU (a few vectorised ops per batch).

Keys emitted (filter them with `keys=`, e.g. `HF_KEYS` for `model(**batch)`):
- `input_ids`, `labels`, `position_ids`: `[B, N]`, or `[1, B*N]` with `flatten=True`;
- `cu_seqlens` (int32, global over the flattened batch), `max_seqlen` (int);
- transformers' flash-attention-2 packed kwargs `cu_seq_lens_q/_k`, `max_length_q/_k`;
- Megatron/Transformer Engine `cu_seqlens_q/_kv` (real lengths) and `max_seqlen_q/_kv`, plus
  `cu_seqlens_q_padded/_kv_padded` (offsets incl. `--pad-multiple` padding) when the store
  was packed with padding (THD format with context parallelism);
- `n_target_tokens` (int): labels that count, to normalise a summed loss across ranks;
- with `seq_idx=True`: `seq_idx` (int32, shaped like `input_ids`): the index of each token's
  segment in the batch (0, 1, ... row after row; tail padding and `pad_to_length` padding are
  segments too), what transformers' `DataCollatorWithFlattening(return_seq_idx=True)` and
  Megatron's Mamba layers pass to state-space and linear-attention kernels;
- with `cp_size=C > 1` (context parallelism, `context_parallel.py`): rank `cp_rank`'s `[1, T/C]`
  `input_ids`, `labels`, `position_ids` (of the unsharded sequence) and `shift_labels`, plus
  `cu_seqlens_local`; every `cu_seqlens*` key stays global and unsharded, `*_padded` always present,
  `n_target_tokens` counts the whole (unsharded) batch.

A preference pack store adds, per `cu_seqlens` segment (global, padding segments included): `pair_ids`
(int64, -1 for padding), `chosen` (bool) and `prefix_segment` (int64: the prompt segment a shared-prompt
completion continues, -1 elsewhere). `keys=` keeps `pair_ids`/`chosen` whenever it keeps `cu_seq_lens_q`
or `cu_seqlens` (what `packtool.loss.pair_logps` reads beside the logits), and a shared-prompt batch ALWAYS
carries `prefix_segment`: without it its P/C/R segments would read as independent sequences.
`cp_size > 1` and `seq_idx=True` are refused for a shared-prompt store (a completion's keys, or its
state-space state, live in another segment).

Items are packs (`PackedDataset`, equal length) or documents (`DocumentDataset`, any length:
`flatten=True` gives the padding-free minibatch; `PaddedCollator` the padded one).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from packtool.errors import ConfigError, FormatError
from packtool.loader import context_parallel
from packtool.loader.buffers import BufferPool
from packtool.loader.dataset import segment_arrays
from packtool.loader.kernels import IGNORE_INDEX, check_cu
from packtool.loader.vision import vision_outputs

HF_KEYS = ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
"""The keys `transformers` models accept in `model(**batch)` for padding-free packed training."""

PAIR_KEYS = ("pair_ids", "chosen", "prefix_segment")
"""Per-segment keys of a preference batch (see the module docstring)."""


def validate_cu_seqlens(cu: torch.Tensor, total_tokens: int, max_seqlen: int, name: str = "cu_seqlens") -> None:
    """Raise a clear error when `cu` cannot describe `total_tokens` tokens with `max_seqlen`.

    The check flash-attn and Transformer Engine never make: int32, starts at 0, never
    decreases, ends at the token count, and no segment is longer than `max_seqlen`.
    """
    if cu.dtype != torch.int32 or cu.ndim != 1 or cu.numel() < 2:
        raise FormatError(
            f"{name} must be a 1-D int32 tensor with at least 2 entries, got {cu.dtype} of shape {tuple(cu.shape)}, build batches with PackedCollator"
        )
    _validate(cu.detach().cpu().numpy(), total_tokens, max_seqlen, name, HAND_BUILT)


HAND_BUILT = "build the offsets with PackedCollator (or from the batch's own document lengths)"
FROM_ITEMS = "the items' offsets are corrupt (a pack store's: run `packtool verify`)"


def _validate(
    c: np.ndarray, total_tokens: int, max_seqlen: int, name: str = "cu_seqlens", fix: str = FROM_ITEMS
) -> None:
    """`validate_cu_seqlens` on an int32 numpy array (the collator's own, before it becomes a tensor); `fix` says
    where a decreasing array came from: the items of a store (the collator) or a caller's own (everything else)."""
    code, at = check_cu(c, int(total_tokens), int(max_seqlen))  # compiled scan: ~1 us per batch
    if code == 1:
        raise FormatError(
            f"{name} runs from {c[0]} to {c[-1]}, expected 0 to {total_tokens} (the token count), the batch and its cu_seqlens disagree"
        )
    if code == 2:
        raise FormatError(
            f"{name} decreases at entry {at + 1} ({c[at]} -> {c[at + 1]}), expected a non-decreasing array, {fix}"
        )
    if code == 3:
        raise FormatError(
            f"max_seqlen {max_seqlen} is below the longest segment ({at} tokens) in {name}, kernels would read out of bounds, pass the true maximum"
        )


class PackedCollator:
    """Collate packs into `[B, N]` (or `[1, B*N]`) tensors plus global `cu_seqlens` kwargs.

    flatten: one row of `B*N` tokens (what transformers' padding-free path and Megatron's THD
        format expect), instead of `[B, N]` rows; `cu_seqlens` is global in both cases.
    static_segments: pad `cu_seqlens` with zero-length segments to `static_segments + 1`
        entries and report `max_seqlen` = row length, so every batch has the same shapes
        (CUDA graphs; Megatron-Bridge's `pad_cu_seqlens`). A batch with more segments raises.
    pad_to_length: VeOmni-style: pad each row (or the flattened row) to this many tokens; the
        padding is one extra segment with `labels = -100` and `input_ids = pad_id`.
    keys: emit only these keys (e.g. `HF_KEYS`), so the batch can go to `model(**batch)`.
    cp_size, cp_rank: context parallelism: emit rank `cp_rank`'s share of the load-balanced split
        (implies the flattened THD layout); every segment and the pack size must be multiples of
        `2 * cp_size` (`packtool pack --pad-multiple 2C`), else a `ConfigError` says so.
    """

    def __init__(
        self,
        flatten: bool = False,
        static_segments: int | None = None,
        pad_to_length: int | None = None,
        pad_id: int = 0,
        keys: Collection[str] | None = None,
        cp_size: int = 1,
        cp_rank: int = 0,
        seq_idx: bool = False,
    ) -> None:
        if static_segments is not None and static_segments < 1:
            raise ConfigError(
                f"static_segments must be >= 1, got {static_segments}, PackedCollator, pass the maximum segments per batch"
            )
        if pad_to_length is not None and pad_to_length < 1:
            raise ConfigError(f"pad_to_length must be >= 1, got {pad_to_length}, PackedCollator, pass a token count")
        context_parallel.check_cp(int(cp_size), int(cp_rank))
        self.cp_size, self.cp_rank = int(cp_size), int(cp_rank)
        self.flatten = flatten or self.cp_size > 1
        self.static_segments = static_segments
        self.pad_to_length = pad_to_length
        self.pad_id = int(pad_id)
        self.keys = None if keys is None else frozenset(keys)
        self.seq_idx = bool(seq_idx)
        self._pool: BufferPool | None = None  # context-parallel output buffers, process-local

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}  # each DataLoader worker grows its own

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        if not items:
            raise ConfigError("cannot collate an empty batch, PackedCollator, use a batch size >= 1")
        stacked = getattr(items, "stacked", None)
        docs = getattr(items, "flat", None)
        pairs = _pair_arrays(stacked, items, docs)
        shared = pairs is not None and bool(pairs[3])
        if shared and self.cp_size > 1:
            raise ConfigError(
                f"a shared-prompt preference batch cannot be split for context parallelism (cp_size={self.cp_size}), "
                "PackedCollator, its completions attend a prompt held in another segment: pack without --share-prompt"
            )
        if shared and self.seq_idx:
            raise ConfigError(
                "seq_idx cannot describe a shared-prompt preference batch, PackedCollator(seq_idx=True), both "
                "completions continue the prompt's state (a branch, not a sequence): pack without --share-prompt"
            )
        at: np.ndarray | None = None
        row_length = int(stacked["rows"].shape[2]) if stacked is not None else None
        if stacked is not None and self.pad_to_length is None:
            # PackedDataset.__getitems__ built rows and cu_seqlens already, in ONE buffer: no copy here
            rows, cu, cu_real = stacked["rows"], stacked["cu_seqlens"], stacked["cu_seqlens_real"]
            _, b, n = rows.shape
            total = b * n
            if self.flatten:
                rows = rows.reshape(3, 1, total)
            padded_keys = bool(stacked["has_segment_padding"])
            if get_worker_info() is None:  # main process: one from_numpy per array is cheapest (~1 us)
                ids, labels, pos = torch.from_numpy(rows[0]), torch.from_numpy(rows[1]), torch.from_numpy(rows[2])
                cu_t = torch.from_numpy(cu)
                # without --pad-multiple padding both arrays hold the same offsets: share the tensor
                cu_real_t = torch.from_numpy(cu_real) if padded_keys else cu_t
            else:  # worker: views of ONE storage, since each storage sent costs a ~1 ms fd round trip
                ids, labels, pos, cu_t, cu_real_t = _views_of_one_storage(stacked["buffer"], rows.shape, cu.size)
            n_target, max_seqlen = stacked["n_target_total"], stacked["max_seqlen"]
        else:
            if stacked is not None:
                t = torch.from_numpy(stacked["rows"])
                ids, labels, pos = t[0], t[1], t[2]
                lens, real, counts, n_target_rows = segment_arrays(stacked)
                padded_keys = bool(stacked["has_segment_padding"])
                n_target = int(n_target_rows.sum())
            elif docs is not None:
                ids, labels, pos, lens, real, counts, padded_keys, n_target = _from_documents(docs, self.flatten)
            else:
                ids, labels, pos, lens, real, counts, padded_keys, n_target = _from_items(items, self.flatten)
            if self.pad_to_length is not None:
                ids, labels, pos, lens, real, counts, at = self._pad(ids, labels, pos, lens, real, counts)
            if self.flatten:
                ids, labels, pos = ids.reshape(1, -1), labels.reshape(1, -1), pos.reshape(1, -1)
            total = ids.numel()
            cu, cu_real = _cumsum32(lens), _cumsum32(real)
            max_seqlen = int(lens.max()) if lens.size else 0
            cu_t, cu_real_t = torch.from_numpy(cu), torch.from_numpy(cu_real)
        row = ids.shape[1]
        _validate(cu, total, max_seqlen)
        seq = segment_index(cu).reshape(ids.shape) if self.seq_idx else None
        cp: dict[str, torch.Tensor] = {}
        if self.cp_size > 1:
            if docs is not None and np.any(np.diff(cu) % (2 * self.cp_size)):
                raise ConfigError(
                    f"documents are not padded to multiples of 2*cp_size={2 * self.cp_size}, PackedCollator(cp_size={self.cp_size}) over DocumentDataset, pack the token store with `packtool pack --pad-multiple {2 * self.cp_size}` and use PackedDataset"
                )
            context_parallel.check_layout(np.diff(cu), self.cp_size, row_length)
            if self._pool is None:
                self._pool = BufferPool()
            cp = context_parallel.shard(ids, labels, pos, cu, self.cp_size, self.cp_rank, self._pool)
            ids, labels, pos = cp.pop("input_ids"), cp.pop("labels"), cp.pop("position_ids")
            if seq is not None:
                seq = seq.reshape(-1)[context_parallel.partition_indices(cu, self.cp_size, self.cp_rank)][None]
            padded_keys = True  # Transformer Engine's THD + CP path always takes the padded offsets
        if self.static_segments is not None:
            cus = torch.from_numpy(_pad_cu(np.stack([cu, cu_real]), self.static_segments))
            cu_t, cu_real_t = cus[0], cus[1]
            max_seqlen = row
        out: dict[str, Any] = {
            "input_ids": ids,
            "labels": labels,
            "position_ids": pos,
            "cu_seqlens": cu_t,
            "max_seqlen": max_seqlen,
            "cu_seq_lens_q": cu_t,
            "cu_seq_lens_k": cu_t,
            "max_length_q": max_seqlen,
            "max_length_k": max_seqlen,
            "cu_seqlens_q": cu_real_t,
            "cu_seqlens_kv": cu_real_t,
            "max_seqlen_q": max_seqlen,
            "max_seqlen_kv": max_seqlen,
            "n_target_tokens": n_target,
            **cp,
        }
        if seq is not None:
            out["seq_idx"] = torch.from_numpy(seq)
        if pairs is not None:
            out.update(_pair_tensors(pairs, at, self.static_segments))
        refuse = "cp_size > 1" if self.cp_size > 1 else "pad_to_length" if self.pad_to_length is not None else None
        vision = vision_outputs(stacked, items, pos, refuse)  # {} for a batch without images
        out.update(vision)
        if padded_keys:
            out["cu_seqlens_q_padded"] = cu_t
            out["cu_seqlens_kv_padded"] = cu_t
        if self.keys is not None:
            keep = set(self.keys)
            if pairs is not None and keep & {"cu_seq_lens_q", "cu_seqlens"}:
                keep |= {"pair_ids", "chosen"}
            if shared:
                keep.add("prefix_segment")
            if "input_ids" in keep:  # the images go wherever their tokens go
                keep |= set(vision)
            out = {k: v for k, v in out.items() if k in keep}
        return out

    def _pad(
        self,
        ids: torch.Tensor,
        labels: torch.Tensor,
        pos: torch.Tensor,
        lens: np.ndarray,
        real: np.ndarray,
        counts: np.ndarray,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Append one padding segment per row (or one at the end of the flattened row); also returns where
        the padding segments went (`np.insert` positions, None when nothing was added)."""
        b, n = ids.shape
        have = b * n if self.flatten else n
        target = int(self.pad_to_length or 0)
        if target < have:
            what = "the flattened batch" if self.flatten else "each pack"
            raise ConfigError(
                f"pad_to_length {target} is shorter than {what} ({have} tokens), PackedCollator, pass pad_to_length >= {have}"
            )
        extra = target - have
        if extra == 0:
            return ids, labels, pos, lens, real, counts, None
        rows = 1 if self.flatten else b
        shape = (1, b * n) if self.flatten else (b, n)
        ids, labels, pos = ids.reshape(shape), labels.reshape(shape), pos.reshape(shape)
        ids = torch.cat([ids, ids.new_full((rows, extra), self.pad_id)], 1)
        labels = torch.cat([labels, labels.new_full((rows, extra), IGNORE_INDEX)], 1)
        pos = torch.cat([pos, torch.arange(extra, dtype=pos.dtype).expand(rows, extra)], 1)
        at = np.array([lens.size]) if self.flatten else np.cumsum(counts)
        lens = np.insert(lens, at, extra)
        real = np.insert(real, at, extra)
        counts = np.array([lens.size]) if self.flatten else counts + 1
        return ids, labels, pos, lens, real, counts, at


def _pair_arrays(
    stacked: dict[str, Any] | None, items: Sequence[dict[str, Any]], docs: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool] | None:
    """`(pair_ids, chosen, prefix_segment, shared)` over the batch's segments (global), or None (no pairs)."""
    if stacked is not None:
        if "pair_ids" not in stacked:
            return None
        return stacked["pair_ids"], stacked["chosen"], stacked["prefix_segment"], bool(stacked["shared_prompt"])
    if isinstance(docs, dict):  # DocumentDataset of a preference token store: one whole sequence per segment
        if "pair_ids" not in docs:
            return None
        pair_ids = np.asarray(docs["pair_ids"], np.int64)
        return pair_ids, np.asarray(docs["chosen"], bool), np.full(pair_ids.size, -1, np.int64), False
    if docs is not None or not any("pair_ids" in it for it in items):
        return None
    if not all("pair_ids" in it for it in items):
        raise ConfigError(
            "some items carry pair_ids and some do not, PackedCollator, collate items of one preference pack store"
        )
    ids, chosen, prefix = [], [], []
    base = 0
    for it in items:  # per item, not per token
        p = np.asarray(it["prefix_segment"], np.int64)
        ids.append(np.asarray(it["pair_ids"], np.int64))
        chosen.append(np.asarray(it["chosen"], bool))
        prefix.append(np.where(p >= 0, p + base, -1))
        base += p.size
    pre = np.concatenate(prefix)
    return np.concatenate(ids), np.concatenate(chosen), pre, bool(np.any(pre >= 0))


def _pair_tensors(
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray, bool], at: np.ndarray | None, static: int | None
) -> dict[str, torch.Tensor]:
    """The pair keys as tensors, with `pad_to_length` segments inserted at `at` and static padding appended."""
    pair_ids, chosen, prefix, _ = pairs
    if at is not None:
        shift = np.searchsorted(at, prefix, side="right")  # entries inserted before each prompt segment
        prefix = np.where(prefix >= 0, prefix + shift, -1)
        pair_ids, chosen, prefix = np.insert(pair_ids, at, -1), np.insert(chosen, at, False), np.insert(prefix, at, -1)
    if static is not None and static > pair_ids.size:
        extra = static - pair_ids.size
        pair_ids = np.concatenate([pair_ids, np.full(extra, -1, np.int64)])
        chosen = np.concatenate([chosen, np.zeros(extra, bool)])
        prefix = np.concatenate([prefix, np.full(extra, -1, np.int64)])
    return {
        "pair_ids": torch.from_numpy(np.ascontiguousarray(pair_ids, np.int64)),
        "chosen": torch.from_numpy(np.ascontiguousarray(chosen, bool)),
        "prefix_segment": torch.from_numpy(np.ascontiguousarray(prefix, np.int64)),
    }


def _from_items(
    items: Sequence[dict[str, Any]], flatten: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray, np.ndarray, bool, int]:
    """Stack (or, for `flatten`, concatenate) item dicts built elsewhere (no `.stacked`/`.flat`):
    rows plus per-row segment lengths. Items of different lengths need `flatten`."""
    sizes = {int(it["input_ids"].numel()) for it in items}
    if len(sizes) > 1 and not flatten:
        raise ConfigError(
            f"items have {len(sizes)} different lengths ({min(sizes)}..{max(sizes)}), PackedCollator(flatten=False) stacks equal-length packs, use flatten=True (padding-free) or PaddedCollator"
        )
    join = torch.cat if flatten else torch.stack
    ids = join([it["input_ids"].reshape(-1) for it in items])
    labels = join([it["labels"].reshape(-1) for it in items])
    pos = join(
        [(it["position_ids"][0] if it["position_ids"].ndim == 2 else it["position_ids"]).reshape(-1) for it in items]
    )
    if flatten:
        ids, labels, pos = ids[None], labels[None], pos[None]
    lens_l, real_l = [], []
    for it in items:  # per item, not per token
        n = int(it["input_ids"].numel())
        cu = np.asarray(it["cu_seqlens"], dtype=np.int64)
        cu_real = np.asarray(it.get("cu_seqlens_unpadded", it["cu_seqlens"]), dtype=np.int64)
        if cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != n or cu_real.shape != cu.shape:
            raise FormatError(
                f"an item's cu_seqlens {cu.tolist()[:8]}... does not start at 0 and end at {n}, PackedCollator, items must come from PackedDataset or DocumentDataset"
            )
        lens_l.append(np.diff(cu))
        real_l.append(np.diff(cu_real))
    lens = np.concatenate(lens_l)
    real = np.concatenate(real_l)
    counts = np.array([lens.size]) if flatten else np.array([x.size for x in lens_l], dtype=np.int64)
    n_target = int(sum(int(it.get("n_target_tokens", 0)) for it in items))
    return ids, labels, pos, lens, real, counts, bool(np.any(lens != real)), n_target


def _from_documents(
    flat: dict[str, Any], flatten: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray, np.ndarray, np.ndarray, bool, int]:
    """The `.flat` batch of `DocumentDataset.__getitems__`: already one row, one segment per document."""
    lens = np.asarray(flat["lengths"], dtype=np.int64)
    if not flatten and lens.size > 1 and np.any(lens != lens[0]):
        raise ConfigError(
            f"documents of {int(lens.min())}..{int(lens.max())} tokens cannot be stacked as rows, PackedCollator(flatten=False), use flatten=True (padding-free) or PaddedCollator"
        )
    t = torch.from_numpy(flat["rows"])
    shape = (1, int(lens.sum())) if flatten else (int(lens.size), int(lens[0]) if lens.size else 0)
    ids, labels, pos = t[0].reshape(shape), t[1].reshape(shape), t[2].reshape(shape)
    counts = np.array([lens.size]) if flatten else np.ones(lens.size, np.int64)
    return ids, labels, pos, lens, lens, counts, False, int(flat["n_target_total"])


def _views_of_one_storage(buffer: np.ndarray, shape: tuple[int, ...], n_cu: int) -> tuple[torch.Tensor, ...]:
    """ids, labels, positions and both cu_seqlens as views of `buffer` (layout: `build_batch`)."""
    t = torch.from_numpy(buffer)
    _, rows, cols = shape
    total = rows * cols
    ids, labels, pos = (t.as_strided((rows, cols), (cols, 1), j * total) for j in range(3))
    t32 = t.view(torch.int32)
    width = buffer.size - 3 * total  # int32 entries per cu row: the int64 tail holds 2 such rows
    cu = t32.as_strided((n_cu,), (1,), 6 * total)
    cu_real = t32.as_strided((n_cu,), (1,), 6 * total + width)
    return ids, labels, pos, cu, cu_real


def segment_index(cu: np.ndarray) -> np.ndarray:
    """int32 `[cu[-1]]`: the segment of every token (zero-length segments take a number, hold no token)."""
    return np.repeat(np.arange(cu.size - 1, dtype=np.int32), np.diff(cu))


def _cumsum32(lens: np.ndarray) -> np.ndarray:
    if lens.size and int(lens.sum()) >= 2**31:
        raise ConfigError(
            f"batch holds {int(lens.sum())} tokens, int32 cu_seqlens overflow, PackedCollator, use a smaller batch"
        )
    cu = np.zeros(lens.size + 1, dtype=np.int32)
    np.cumsum(lens, out=cu[1:])
    return cu


def _pad_cu(cu: np.ndarray, segments: int) -> np.ndarray:
    """Megatron-Bridge's `pad_cu_seqlens` on `[2, K+1]` (cu, cu_real): repeat the last offset."""
    have = cu.shape[1] - 1
    if have > segments:
        raise ConfigError(
            f"batch has {have} segments, more than static_segments={segments}, PackedCollator, raise static_segments (or pack with --max-docs-per-pack)"
        )
    out = np.empty((2, segments + 1), dtype=np.int32)
    out[:, : have + 1] = cu
    out[:, have + 1 :] = cu[:, -1:]
    return out
