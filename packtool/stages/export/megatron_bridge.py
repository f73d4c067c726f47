"""`--to megatron-bridge`: `{S}_{N}.idx.parquet` + `{N}_metadata.jsonl`, read by `GPTSFTPackedParquetDataset`.

Megatron-Bridge's conventions (read from megatron-bridge 0.6.2, `data/packing/`):
- a row holds the pack's sequences back to back, WITHOUT tail padding (`input_ids`, variable
  length); `seq_start_id` is each sequence's start, 0 first, no final total;
- `loss_mask` is stored SHIFTED: `loss_mask[t] == 1` iff `input_ids[t + 1]` is a target of the
  same sequence (0 at each sequence's last token);
- its `collate_fn` drops one token per sequence (inputs `ids[s:e-1]`, labels `ids[s+1:e]`), pads
  the row to the batch length with the EOS id, and zeroes the loss wherever the INPUT token is
  EOS.

So the same (context, target) pairs as packtool's loader come out, as long as no target follows
an EOS inside a sequence: such a store is refused (Megatron-Bridge would silently drop those
targets). `--pad-multiple` stores are refused too: Megatron-Bridge's `pad_seq_to_mult` pads the
SHIFTED length (stored length - 1) with EOS and recovers the real length by searching for the last
non-EOS token, while packtool pads the stored length with the pad id, so `cu_seqlens_*_padded`
would not be multiples of M (re-pack without it and let Megatron-Bridge pad, or train with
packtool's loader, whose `cu_seqlens_q_padded` are right for context parallelism).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.choices import ExportTarget
from packtool.errors import ConfigError
from packtool.formats.exports import (
    MEGATRON_METADATA_KEYS,
    megatron_metadata_name,
    megatron_parquet_name,
    merged_megatron_metadata,
)
from packtool.formats.pack_store import PackSplit
from packtool.stages.export.blocks import PackBlock, stream_parquet
from packtool.stages.export.config import Exporter, ExportJob, TokenizerIds


def file_names(split: str, size: int) -> tuple[list[str], list[str]]:
    return [megatron_parquet_name(split, size)], [megatron_metadata_name(size)]


def check(store: PackSplit, ids: TokenizerIds, target: str = "megatron-bridge") -> None:
    """Refuse what Megatron-Bridge's packed datasets cannot represent (before anything is written)."""
    pad_multiple = int(store.metadata.get("pad_multiple", 1) or 1)
    if pad_multiple > 1 or bool(np.any(store.seg_pad)):
        raise ConfigError(
            f"{store.split}_{store.size} was packed with --pad-multiple {pad_multiple}, {store.directory}, "
            f"{target} pads the shifted length with EOS (pad_seq_to_mult) and cannot read packtool's padding: "
            "re-pack without --pad-multiple (set Megatron's pad_seq_to_mult there) or train with packtool's loader"
        )
    if ids.eos_id is None:
        raise ConfigError(
            f"the EOS id of {store.directory} is unknown (its source token store is gone or changed), "
            f"--to {target}, pass --eos-id (Megatron zeroes the loss where the input token is EOS)"
        )


def shifted(block: PackBlock, eos_id: int, store: PackSplit) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The block's rows in Megatron-Bridge's convention: `column -> (row offsets, flat values)`."""
    in_use = block.in_use()
    loss = np.zeros_like(block.target)
    loss[:, :-1] = block.target[:, 1:]  # target of t+1; 0 at a sequence's last token (next one starts or tail)
    clash = loss & (block.tokens == eos_id)
    if clash.any():
        row = int(np.flatnonzero(clash.any(axis=1))[0])
        raise ConfigError(
            f"{int(clash.sum())} targets follow an EOS ({eos_id}) inside a sequence (first in pack {block.p0 + row}), "
            f"{store.directory}, Megatron zeroes the loss after every EOS input: re-tokenize so EOS ends documents only, "
            "or train with packtool's loader"
        )
    row_offsets = np.zeros(block.n_packs + 1, dtype=np.int64)
    np.cumsum(block.used, out=row_offsets[1:])
    seq_offsets = np.zeros(block.n_packs + 1, dtype=np.int64)
    np.cumsum(block.counts, out=seq_offsets[1:])
    return {
        "input_ids": (row_offsets, block.tokens[in_use]),
        "loss_mask": (row_offsets, loss[in_use]),
        "seq_start_id": (seq_offsets, block.seg_start),
    }


def metadata_entry(store: PackSplit) -> dict[str, Any]:
    """Megatron-Bridge's metadata object for this split (same definitions; `split` added to merge by)."""
    entry = {key: store.metadata[key] for key in MEGATRON_METADATA_KEYS}
    entry["split"] = store.split
    return entry


def config_lines(job: ExportJob, data_file: str, trainer: str) -> tuple[list[str], dict[str, Any]]:
    """The lines of a Megatron-Bridge / NeMo 2 config that read the export, and the numbers they need."""
    store = job.store
    size, factor = store.size, float(store.metadata["packing_factor"])
    path_key = {"training": "packed_train_data_path", "validation": "packed_val_data_path"}.get(store.split)
    data = str(job.directory / data_file)
    meta = str(job.directory / megatron_metadata_name(size))
    spec = f"packed_sequence_size={size}, " + (f'{path_key}="{data}", ' if path_key else "")
    example = max(1, round(128 / factor)) if factor else 128
    lines = [
        f'{trainer}: PackedSequenceSpecs({spec}packed_metadata_path="{meta}", pad_seq_to_mult=1)',
        f"  seq_length={size}, micro_batch_size=1 (one pack per micro batch), answer_only_loss=True (the default: reads loss_mask)",
        f"  tokenizer EOS id must be {job.ids.eos_id} (the loss is zeroed where the input token is EOS)",
        f"  packing factor {factor:g}: global_batch_size = your unpacked global batch size / {factor:g} (e.g. 128 -> {example})",
    ]
    if path_key is None:
        lines.insert(1, f"  split {store.split!r}: pass {data} where your recipe reads this split")
    return lines, {"packing_factor": factor, "global_batch_size_divisor": factor}


def write(job: ExportJob) -> tuple[list[str], dict[str, Any]]:
    store = job.store
    name = megatron_parquet_name(store.split, store.size)
    eos_id = int(job.ids.eos_id)  # type: ignore[arg-type]  # check() refused a store without one
    stream_parquet(job.staged.path(name), "megatron-bridge", store, lambda b: shifted(b, eos_id, store), job.progress)
    meta_name = megatron_metadata_name(store.size)
    job.staged.path(meta_name).write_bytes(merged_megatron_metadata(job.staged.final(meta_name), metadata_entry(store)))
    return config_lines(job, name, "Megatron-Bridge")


EXPORTER = Exporter(
    target=ExportTarget.MEGATRON_BRIDGE,
    files="`{S}_{N}.idx.parquet` (input_ids, shifted loss_mask, seq_start_id) + `{N}_metadata.jsonl`",
    reader="Megatron-Bridge `GPTSFTPackedParquetDataset`",
    file_names=file_names,
    check=check,
    write=write,
)
