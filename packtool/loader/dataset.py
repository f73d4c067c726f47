"""`PackedDataset`: one item per pack, built from the pack store's memory maps.

Every pack row `[N]` becomes `input_ids`, unshifted `labels` (-100 at each segment's first
token, at non-target tokens, on `--pad-multiple` padding and on the tail padding),
`position_ids` restarting at 0 per segment and `cu_seqlens` (tail padding its own segment).
The per-pack segment lists come from the CSR companions (`pack_offsets`, `seg_lens`,
`seg_pad`), so nothing per pack parses JSON, and a whole batch is built by one compiled pass
over its rows (`kernels.fill_batch`, from `__getitems__`, which `torch.utils.data.DataLoader`
calls with the batch's indices): a handful of Python calls per batch, none per token.

A preference pack store's items also carry, per `cu_seqlens` segment, `pair_ids` (int64, -1 for
padding), `chosen` (bool) and `prefix_segment` (int64: a shared-prompt completion's prompt segment,
item-local; -1 elsewhere), and a shared-prompt store's completions continue their prompt's positions.

The maps are opened lazily and re-opened when the process id changes, and `__getstate__`
drops them, so DataLoader workers (fork or spawn) share the page cache instead of copying.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numba
import numpy as np
import torch
from torch.utils.data import get_worker_info

from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_checks import vision_of
from packtool.formats.pack_store import (
    ROLE_CHOSEN,
    ROLE_CHOSEN_COMPLETION,
    ROLE_NAMES,
    ROLE_PROMPT,
    ROLE_REJECTED_COMPLETION,
    PackSplit,
    find_pack_dir,
    metadata_for,
    metadata_name,
    open_pack_split,
    parse_data_name,
    sizes_in,
)
from packtool.loader.buffers import BufferPool
from packtool.loader.kernels import fill_batch, segments_of

_MAIN_PID = os.getpid()  # the process that imported the loader: numba's threads may be used here only


class PackedBatchItems(Sequence[dict[str, Any]]):
    """What `__getitems__` returns: the stacked batch arrays, seen as a sequence of item dicts.

    `PackedCollator` takes `.stacked` directly (no per-item dicts, no re-stacking); any other
    collate function indexes it like a list and gets item dicts built on demand (views).
    """

    def __init__(self, stacked: dict[str, Any]) -> None:
        self.stacked = stacked
        self._items: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return int(self.stacked["rows"].shape[1])

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if self._items is None:
            self._items = _split_items(self.stacked)
        return self._items[i]


class PackedDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Map-style dataset over one (split, size) of a pack store; `ds[i]` is pack i.

    `path` is a `packed/{tokenizer}` directory, a pack ROOT holding one tokenizer, or a
    `{split}_{N}.npy` file (which then fixes split and size). `size` may be left out when the
    directory holds one size only.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str = "training",
        size: int | None = None,
        sources: Sequence[str | os.PathLike[str]] | None = None,
    ) -> None:
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1):
            raise ConfigError(f"size={size!r} is not a pack size, PackedDataset, pass a positive int N or leave it out")
        p = Path(path)
        if p.is_file():
            named = parse_data_name(p.name)
            if named is None:
                raise ConfigError(
                    f"{p.name} is not a pack file named {{split}}_{{N}}.npy, {p}, pass the pack directory or a {{split}}_{{N}}.npy file"
                )
            split, file_size = named
            if size is not None and size != file_size:
                raise ConfigError(
                    f"size={size} contradicts the file name {p.name}, {p}, drop size= or pass the matching file"
                )
            size = file_size
        if isinstance(size, int) and not isinstance(size, bool) and p.is_dir() and (p / metadata_name(size)).is_file():
            self.directory, sizes = p, [int(size)]  # what the two scans below would conclude, without them
        else:
            self.directory = find_pack_dir(p)
            sizes = sizes_in(self.directory)
        if size is None:
            if len(sizes) != 1:
                found = ", ".join(map(str, sizes)) or "none"
                raise ConfigError(f"pack directory holds sizes {found}, {self.directory}, pass size=N to choose one")
            size = sizes[0]
        elif size not in sizes:
            found = ", ".join(map(str, sizes)) or "none"
            raise ConfigError(
                f"no packs of size {size} (found {found}), {self.directory}, pass one of those or run `packtool pack --size {size}`"
            )
        self.split = split
        self.size = int(size)
        self.metadata: dict[str, Any] = metadata_for(self.directory, split, self.size)
        self.pad_id = int(self.metadata.get("pad_id", 0))
        self._pid = -1
        self._store: PackSplit | None = None
        self._views: tuple[np.ndarray, ...] | None = None
        self._pairs: PairViews | None = None
        self._pool: BufferPool | None = None
        #: a vision split: items add pixels, grids, M-RoPE positions [4, N], token types (`loader/vision.py`);
        #: its images are read from its source token stores (`sources` where they moved)
        self.vision = vision_of(self.metadata) is not None
        self._sources = None if sources is None else [str(p) for p in sources]
        self._vis: Any = None
        store = self._open()  # validate now, in the parent, so errors surface before workers start
        self.n_packs = store.n_packs
        #: Megatron's *_padded cu_seqlens only make sense when --pad-multiple padded something
        self.has_segment_padding = bool(store.seg_pad.size and np.any(store.seg_pad))
        #: a preference pack store: items carry pair_ids / chosen / prefix_segment
        self.preference = store.preference is not None
        #: pairs packed as [prompt][chosen completion][rejected completion] (`pack --share-prompt`)
        self.shared_prompt = store.shared_prompt

    # -- process-local memory maps -------------------------------------------------------
    def _open(self) -> PackSplit:
        if self._store is None or self._pid != os.getpid():
            self._store = open_pack_split(self.directory, self.split, self.size)
            self._views = plain_views(self._store)
            self._pairs = pair_views(self._store)
            self._pool = BufferPool()
            if self.vision:
                from packtool.loader.vision import VisionViews

                self._vis = VisionViews(self._store, self._sources)
            self._pid = os.getpid()
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_store"] = None  # never pickle the maps: each worker re-opens its own
        state["_views"] = None
        state["_pairs"] = None
        state["_pool"] = None
        state["_vis"] = None
        state["_pid"] = -1
        return state

    # -- items -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.n_packs

    def __getitem__(self, index: int) -> dict[str, Any]:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):  # ds[1.5] read ds[1]
            raise ConfigError(f"pack index {index!r} is not an integer, PackedDataset.__getitem__, pass an int")
        i = int(index)
        if not -self.n_packs <= i < self.n_packs:
            raise IndexError(f"pack {i} is out of range, the split holds {self.n_packs} packs")
        if i < 0:
            i += self.n_packs
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> PackedBatchItems:
        """Build several packs at once (vectorised over the batch); DataLoader calls this."""
        store = self._open()
        raw = np.asarray(indices)
        if raw.size and raw.dtype.kind not in "iu":  # [1.5] read pack 1, [True] pack 1
            raise ConfigError(
                f"pack indices {list(indices)[:4]!r} are not integers, PackedDataset.__getitems__, pass ints"
            )
        if raw.size and (int(raw.min()) < 0 or int(raw.max()) >= self.n_packs):
            raise IndexError(f"pack indices out of range [0, {self.n_packs}): {list(indices)[:4]!r}")
        stacked = build_batch(store, raw.astype(np.int64, copy=False), self._views, self._pool, self._pairs)
        stacked["has_segment_padding"] = self.has_segment_padding
        if self._vis is not None:  # decoded and processed here: in the DataLoader worker
            idx = np.asarray(indices, np.int64)
            stacked["vision"] = self._vis.batch(idx, stacked["rows"], segment_arrays(stacked))
        return PackedBatchItems(stacked)


class PairViews:
    """A preference pack store's per-segment arrays, as the loader needs them (built once per process)."""

    def __init__(self, store: PackSplit) -> None:
        if store.seg_pair is None or store.seg_role is None:
            raise FormatError(f"{store.split}_{store.size} is not a preference split, {store.directory}, this is a bug")
        self.pair = np.asarray(store.seg_pair, np.int64)
        self.role = np.asarray(store.seg_role, np.uint8)
        self.shared = store.shared_prompt
        lens = np.asarray(store.seg_lens, np.int64)
        bad = ~np.isin(self.role, list(ROLE_NAMES))
        if bad.any():
            j = int(np.argmax(bad))
            raise FormatError(
                f"segment {j} has role {int(self.role[j])}, expected one of {sorted(ROLE_NAMES)}, "
                f"{store.directory / store.file_name('seg_role')}, run `packtool verify` and re-run `packtool pack`"
            )
        # a completion continues its prompt: 1 (chosen) or 2 (rejected) segments before it
        back = np.where(self.role == ROLE_CHOSEN_COMPLETION, 1, np.where(self.role == ROLE_REJECTED_COMPLETION, 2, 0))
        at = np.flatnonzero(back)
        prompt = at - back[at]
        if at.size and (
            np.any(prompt < 0) or np.any(self.role[np.maximum(prompt, 0)] != ROLE_PROMPT) or not self.shared
        ):
            raise FormatError(
                f"a completion segment does not follow its prompt segment, {store.directory / store.file_name('seg_role')}, "
                "run `packtool verify` and re-run `packtool pack`"
            )
        self.back = back
        self.pos0: np.ndarray | None = None
        if self.shared:
            self.pos0 = np.zeros(lens.size, np.int64)
            self.pos0[at] = lens[prompt]

    def keys(self, which: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(pair_ids, chosen, prefix_segment)` of batch entries whose store segments are `which` (-1: padding);
        `prefix_segment` indexes the entries themselves."""
        real = which >= 0
        w = np.where(real, which, 0)
        pair = np.where(real, self.pair[w], -1)
        role = np.where(real, self.role[w], 0)
        chosen = (role == ROLE_CHOSEN) | (role == ROLE_CHOSEN_COMPLETION)
        back = np.where(real, self.back[w], 0)
        prefix = np.where(back > 0, np.arange(which.size, dtype=np.int64) - back, -1)
        return pair.astype(np.int64), chosen, prefix.astype(np.int64)


def pair_views(store: PackSplit) -> PairViews | None:
    """`PairViews` of a preference pack store, None for a plain one."""
    return PairViews(store) if store.seg_pair is not None else None


def build_batch(
    store: PackSplit,
    idx: np.ndarray,
    views: tuple[np.ndarray, ...] | None = None,
    pool: BufferPool | None = None,
    pairs: PairViews | None = None,
) -> dict[str, Any]:
    """Stacked arrays for the packs `idx`: `rows` `[3, B, N]` (ids, labels, positions) and segments.

    One compiled pass (`kernels.fill_batch`, over numba's threads when `parallel_ok()`) over the batch's rows. `cu_seqlens`/`cu_seqlens_real` are the global int32
    offsets over the flattened batch; `segment_arrays` gives the per-segment lengths. `rows`
    and both cu_seqlens live in ONE int64 buffer (one shared-memory storage when a worker sends
    the batch).
    """
    tokens, loss, po, lens, pads = views if views is not None else plain_views(store)
    n = store.size
    b = int(idx.size)
    if b * n >= 2**31:
        raise ConfigError(f"batch holds {b * n} tokens, int32 cu_seqlens overflow, PackedDataset, use a smaller batch")
    n_seg = segments_of(po, idx)  # also checks the indices
    if n_seg < 0:
        raise IndexError(f"pack index out of range 0..{po.size - 2}: got {idx.tolist()!r}")
    cap = b + n_seg
    # ONE allocation for everything that becomes a tensor: [3, B, N] int64 rows, then the two
    # int32 cu_seqlens arrays; a DataLoader worker then ships one shared-memory storage per batch
    # (each storage costs a file-descriptor round trip, ~1 ms, far more than building the batch)
    need = 3 * b * n + cap + 1
    buffer = pool.get(need) if pool is not None else np.empty(need, dtype=np.int64)
    rows = buffer[: 3 * b * n].reshape(3, b, n)
    cus = buffer[3 * b * n :].view(np.int32).reshape(2, -1)  # two rows of >= cap + 1 entries
    seg = np.empty((5, cap), dtype=np.int64)  # lengths, real lengths, entries per pack, targets per pack, source
    parallel = b > 1 and parallel_ok()
    if pairs is None and store.seg_pair is not None:
        pairs = pair_views(store)
    k, bad, longest, n_target_total = fill_batch(
        tokens,
        loss,
        loss.size > 0,
        po,
        lens,
        pads,
        idx,
        rows,
        seg,
        cus,
        parallel,
        None if pairs is None else pairs.pos0,
    )
    if bad >= 0:
        raise FormatError(
            f"pack {int(idx[bad])} has inconsistent segment lengths (sum > {n}, negative, or padding > length), {store.directory}, re-run `packtool pack`"
        )
    # few Python objects per batch: per-segment arrays are sliced by whoever needs them (`segment_arrays`)
    extra: dict[str, Any] = {}
    if pairs is not None:
        pair_ids, chosen, prefix = pairs.keys(seg[4, :k])
        extra = {"pair_ids": pair_ids, "chosen": chosen, "prefix_segment": prefix, "shared_prompt": pairs.shared}
    return {
        **extra,
        "buffer": buffer,
        "rows": rows,  # input_ids, labels, position_ids
        "segments": seg,
        "n_entries": k,
        "cu_seqlens": cus[0, : k + 1],
        "cu_seqlens_real": cus[1, : k + 1],
        "max_seqlen": longest,
        "n_target_total": n_target_total,
    }


def segment_arrays(stacked: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(seg_lens, seg_real, seg_counts, n_target_tokens)` of a `build_batch` result.

    Segment arrays cover every pack in order, each pack's segments followed by its tail padding
    segment (dropped when empty); `seg_counts[b]` says how many entries pack b owns; `seg_real`
    leaves out `--pad-multiple` padding (Megatron's real lengths).
    """
    seg, k, b = stacked["segments"], stacked["n_entries"], stacked["rows"].shape[1]
    return seg[0, :k], seg[1, :k], seg[2, :b], seg[3, :b]


def parallel_ok() -> bool:
    """Whether this call may spread a batch over numba's threads (`numba.get_num_threads()` > 1).

    Never in a DataLoader worker (workers are the parallelism there: threads would oversubscribe)
    nor in any process forked from the importing one: numba's OpenMP layer (GNU libgomp) aborts a
    forked child that launches threads its parent had started. `NUMBA_NUM_THREADS=1` (or
    `numba.set_num_threads(1)`) selects the single-threaded kernel everywhere.
    """
    return os.getpid() == _MAIN_PID and get_worker_info() is None and numba.get_num_threads() > 1


def plain_views(store: PackSplit) -> tuple[np.ndarray, ...]:
    """The maps as plain ndarray views (what numba takes; `np.memmap` indexing is slow in Python)."""
    loss = np.zeros((0, 0), np.uint8) if store.loss is None else np.asarray(store.loss)
    return (
        np.asarray(store.tokens),
        loss,
        np.asarray(store.pack_offsets),
        np.asarray(store.seg_lens),
        np.asarray(store.seg_pad),
    )


def _split_items(stacked: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-pack item dicts whose tensors are views of the stacked arrays (no copy)."""
    ids, labels, pos = torch.from_numpy(stacked["rows"]).unbind(0)
    seg_lens, seg_real, counts, n_target = segment_arrays(stacked)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    items = []
    for r in range(ids.shape[0]):  # per pack, not per token
        a, c = int(bounds[r]), int(bounds[r + 1])
        lens = seg_lens[a:c]
        cu = np.zeros(lens.size + 1, dtype=np.int32)
        np.cumsum(lens, out=cu[1:])
        cu_real = np.zeros(lens.size + 1, dtype=np.int32)
        np.cumsum(seg_real[a:c], out=cu_real[1:])
        pair: dict[str, Any] = {}
        if "pair_ids" in stacked:
            prefix = stacked["prefix_segment"][a:c]
            pair = {
                "pair_ids": torch.from_numpy(stacked["pair_ids"][a:c]),
                "chosen": torch.from_numpy(stacked["chosen"][a:c]),
                "prefix_segment": torch.from_numpy(np.where(prefix >= 0, prefix - a, -1)),
            }
        vis = _vision_item(stacked.get("vision"), r, pos[r])
        items.append(
            {
                **pair,
                **vis,
                "input_ids": ids[r],
                "labels": labels[r],
                "position_ids": vis.pop("position_ids", pos[r]),
                "cu_seqlens": torch.from_numpy(cu),
                "cu_seqlens_unpadded": torch.from_numpy(cu_real),
                "max_seqlen": int(lens.max()) if lens.size else 0,
                "n_target_tokens": int(n_target[r]),
            }
        )
    return items


def _vision_item(v: dict[str, Any] | None, r: int, pos: torch.Tensor) -> dict[str, Any]:
    """Pack r's vision keys (`loader/vision.py`, views of the batch's arrays): `position_ids` [4, N] for M-RoPE
    families (row 0 = `pos`)."""
    if v is None:
        return {}
    pb, ib = v["pixel_bounds"], v["image_bounds"]
    out: dict[str, Any] = {"pixel_values": torch.from_numpy(v["pixel_values"][pb[r] : pb[r + 1]])}
    if "image_grid_thw" in v:
        out["image_grid_thw"] = torch.from_numpy(v["image_grid_thw"][ib[r] : ib[r + 1]])
    if "mrope" in v:
        out["position_ids"] = torch.cat([pos[None], torch.from_numpy(np.ascontiguousarray(v["mrope"][:, r]))])
    if "token_type_ids" in v:
        out["token_type_ids"] = torch.from_numpy(v["token_type_ids"][r])
    return out
