"""`--to nemo`: `{S}_{N}.npy` + `{N}_metadata.jsonl`, the legacy packed format of NeMo 2 and Megatron-Bridge.

The `.npy` holds a 1-D NumPy OBJECT array with one dict per pack, `input_ids`, `loss_mask` (shifted)
and `seq_start_id` as plain Python lists: the readers (`GPTSFTPackedDataset` in NeMo 2 and in
Megatron-Bridge) compute `seq_start_id + [len(input_ids)]`, which an ndarray would silently turn into
an element-wise addition. The file is a pickle by their design (Megatron-Bridge unpickles it with a
restricted unpickler); packtool's own stores stay pickle-free. Rows, shift, EOS rule and the
`--pad-multiple` refusal are exactly those of `megatron_bridge` (same collate function).

The int lists are written as pre-encoded pickle opcodes (`formats.exports.PickledIntList`), never as
Python ints, so writing costs about what the Parquet targets cost; the readers still load the whole
pickle into Python objects (~40 bytes per token): prefer `--to megatron-bridge` for large stores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.choices import ExportTarget
from packtool.formats.exports import (
    PickledIntList,
    megatron_metadata_name,
    merged_megatron_metadata,
    nemo_name,
    write_object_npy,
)
from packtool.formats.pack_store import PackSplit
from packtool.stages.export import megatron_bridge
from packtool.stages.export.blocks import iter_blocks
from packtool.stages.export.config import Exporter, ExportJob, TokenizerIds


def file_names(split: str, size: int) -> tuple[list[str], list[str]]:
    return [nemo_name(split, size)], [megatron_metadata_name(size)]


def check(store: PackSplit, ids: TokenizerIds) -> None:
    megatron_bridge.check(store, ids, "nemo")


def write(job: ExportJob) -> tuple[list[str], dict[str, Any]]:
    store = job.store
    rows: list[dict[str, PickledIntList]] = []
    for block in iter_blocks(store):
        cols = megatron_bridge.shifted(block, int(job.ids.eos_id), store)  # type: ignore[arg-type]
        offsets, ids = cols["input_ids"]
        _, loss = cols["loss_mask"]
        seq_offsets, starts = cols["seq_start_id"]
        ids_rows = np.split(ids, offsets[1:-1])  # views, encoded per pack as pickled lists (no Python ints)
        loss_rows = np.split(loss.view(np.uint8), offsets[1:-1])
        start_rows = np.split(starts, seq_offsets[1:-1])
        for a, b, c in zip(ids_rows, loss_rows, start_rows, strict=True):  # per pack, not per token
            rows.append(
                {"input_ids": PickledIntList(a), "loss_mask": PickledIntList(b), "seq_start_id": PickledIntList(c)}
            )
        if job.progress is not None:
            job.progress(block.p1, store.n_packs)
    name = nemo_name(store.split, store.size)
    with open(job.staged.path(name), "wb") as fh:
        write_object_npy(fh, rows)
    meta_name = megatron_metadata_name(store.size)
    entry = megatron_bridge.metadata_entry(store)
    job.staged.path(meta_name).write_bytes(merged_megatron_metadata(job.staged.final(meta_name), entry))
    return megatron_bridge.config_lines(job, name, "NeMo 2 / Megatron-Bridge (legacy .npy)")


EXPORTER = Exporter(
    target=ExportTarget.NEMO,
    files="`{S}_{N}.npy` (object array of input_ids, shifted loss_mask, seq_start_id) + `{N}_metadata.jsonl`",
    reader="NeMo 2 / Megatron-Bridge `GPTSFTPackedDataset` (legacy .npy)",
    file_names=file_names,
    check=check,
    write=write,
)
