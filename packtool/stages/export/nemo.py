"""`--to nemo`: `{S}_{N}.npy` + `{N}_metadata.jsonl`, the legacy packed format of NeMo 2 and Megatron-Bridge.

The `.npy` holds a 1-D NumPy OBJECT array with one dict per pack, `input_ids`, `loss_mask` (shifted)
and `seq_start_id` as plain Python lists: the readers (`GPTSFTPackedDataset` in NeMo 2 and in
Megatron-Bridge) compute `seq_start_id + [len(input_ids)]`, which an ndarray would silently turn into
an element-wise addition. The file is a pickle by their design (Megatron-Bridge unpickles it with a
restricted unpickler); packtool's own stores stay pickle-free. Rows, shift, EOS rule and the
`--pad-multiple` refusal are exactly those of `megatron_bridge` (same collate function).

Memory: the readers load the whole pickle into Python objects (~40 bytes per token), so this file is
built whole as well; prefer `--to megatron-bridge` (Parquet, streamed) for large stores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.formats.exports import megatron_metadata_name, merged_megatron_metadata, nemo_name, write_object_npy
from packtool.formats.pack_store import PackSplit
from packtool.stages.export import megatron_bridge
from packtool.stages.export.blocks import iter_blocks
from packtool.stages.export.config import ExportJob, TokenizerIds


def file_names(split: str, size: int) -> tuple[list[str], list[str]]:
    return [nemo_name(split, size)], [megatron_metadata_name(size)]


def check(store: PackSplit, ids: TokenizerIds) -> None:
    megatron_bridge.check(store, ids, "nemo")


def write(job: ExportJob) -> tuple[list[str], dict[str, Any]]:
    store = job.store
    rows: list[dict[str, list[int]]] = []
    for block in iter_blocks(store):
        cols = megatron_bridge.shifted(block, int(job.ids.eos_id), store)  # type: ignore[arg-type]
        offsets, ids = cols["input_ids"]
        _, loss = cols["loss_mask"]
        seq_offsets, starts = cols["seq_start_id"]
        ids_l, loss_l, starts_l = ids.tolist(), loss.astype(np.int64).tolist(), starts.tolist()
        for r in range(block.n_packs):  # per pack, not per token: slicing Python lists
            a, b = int(offsets[r]), int(offsets[r + 1])
            c, d = int(seq_offsets[r]), int(seq_offsets[r + 1])
            rows.append({"input_ids": ids_l[a:b], "loss_mask": loss_l[a:b], "seq_start_id": starts_l[c:d]})
        if job.progress is not None:
            job.progress(block.p1, store.n_packs)
    name = nemo_name(store.split, store.size)
    with open(job.staged.path(name), "wb") as fh:
        write_object_npy(fh, rows)
    meta_name = megatron_metadata_name(store.size)
    entry = megatron_bridge.metadata_entry(store)
    job.staged.path(meta_name).write_bytes(merged_megatron_metadata(job.staged.final(meta_name), entry))
    return megatron_bridge.config_lines(job, name, "NeMo 2 / Megatron-Bridge (legacy .npy)")
