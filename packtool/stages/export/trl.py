"""`--to trl`: `{S}_{N}.parquet`, one row per pack, for TRL's padding-free `SFTTrainer` without re-packing.

Columns: `input_ids` (the whole row of N tokens), `labels` (unshifted, -100 = no loss: exactly the
loader's labels) and `seq_lengths` (the pack's segments, then the tail padding as one more sequence
when the pack is not full, so they sum to N). TRL 1.16's `DataCollatorForLanguageModeling(padding_free=True)`
rebuilds `position_ids` from `seq_lengths`, sets -100 where a position is 0 (already -100 here) and
derives `cu_seq_lens_q/k` from the positions: the flattened `[1, B*N]` batch equals
`PackedCollator(flatten=True)` of the same packs, tail segment included (fixed shapes; the tail is
~0-3% of a BFD pack). `--pad-multiple` padding stays inside its segment, as in the loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packtool.choices import ExportTarget
from packtool.formats.exports import trl_name
from packtool.formats.pack_store import PackSplit, preference_of
from packtool.stages.export.blocks import PackBlock, stream_parquet
from packtool.stages.export.config import Exporter, ExportJob, TokenizerIds

IGNORE_INDEX = -100


def file_names(split: str, size: int) -> tuple[list[str], list[str]]:
    return [trl_name(split, size)], []


def check(store: PackSplit, ids: TokenizerIds) -> None:
    """Every pack store can be expressed: nothing to refuse."""


def columns(block: PackBlock) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The block's rows in TRL's convention: `column -> (row offsets, flat values)`."""
    n = block.size
    row_offsets = np.arange(block.n_packs + 1, dtype=np.int64) * n
    labels = np.where(block.target, block.tokens.astype(np.int32), np.int32(IGNORE_INDEX))
    tail = n - block.used
    has_tail = tail > 0
    ends = np.cumsum(block.counts)  # each pack's tail goes right after its last segment
    seq_lengths = np.insert(block.seg_len, ends[has_tail], tail[has_tail])
    seq_offsets = np.zeros(block.n_packs + 1, dtype=np.int64)
    np.cumsum(block.counts + has_tail, out=seq_offsets[1:])
    return {
        "input_ids": (row_offsets, block.tokens.reshape(-1)),
        "labels": (row_offsets, labels.reshape(-1)),
        "seq_lengths": (seq_offsets, seq_lengths),
    }


def sft_recipe(data: Path, size: int) -> list[str]:
    """The lines `export --to trl` prints for TRL's `SFTTrainer` on `data` (rows of `size` tokens): the one place
    the SFT recipe is written (docs/HF.md and docs/EXPORT.md show the same)."""
    return [
        f'TRL SFT: train_dataset = datasets.load_dataset("parquet", data_files="{data}", split="train")',
        "  SFTConfig(packing=False, padding_free=True, max_length=None, "
        'dataset_kwargs={"skip_prepare_dataset": True}, per_device_train_batch_size=B)',
        "  on CPU add use_cpu=True, bf16=False (TRL turns bf16 on by default)",
        f"  one row = one pack of {size} tokens: B rows give B*{size} tokens per device step",
        '  attention: import packtool.hf, then from_pretrained(..., attn_implementation="packtool") attends each '
        "sequence alone through varlen kernels on the cu_seq_lens TRL passes (flash-attn when installed, else "
        "torch's own on CUDA; no T*T mask); sdpa/eager keep sequences apart only with a T*T mask built from "
        "position_ids (SFTTrainer's use_cache=False)",
    ]


def is_preference(metadata: dict[str, Any]) -> bool:
    """A preference (DPO) pack store: its metadata line carries the `preference` record."""
    return preference_of(metadata) is not None


def dpo_recipe(directory: Any, size: int) -> list[str]:
    """The TRL 1.16 DPOTrainer recipe for a preference pack store (docs/HF.md, "Preference pairs (DPO) on packs")."""
    return [
        "TRL DPO (preference pack store): import packtool.hf; from packtool.hf.dpo import PackedDPOTrainer, "
        "PreferencePackCollator, packs_dataset",
        f'  packs = packs_dataset("{directory}", size={size})  # a datasets.Dataset, one row per pack',
        '  model / ref_model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="packtool") (two copies)',
        "  PackedDPOTrainer(model=model, ref_model=ref_model, train_dataset=packs, "
        "data_collator=PreferencePackCollator(), processing_class=tokenizer,",
        "    args=DPOConfig(loss_type=..., remove_unused_columns=False, max_length=None, "
        "per_device_train_batch_size=B))  # on CPU add bf16=False, use_cpu=True",
        f"  one row = one pack of {size} tokens holding whole pairs; every TRL loss_type, exact to TRL's padded "
        "DPOTrainer; precompute_ref_log_probs=True stores reference log-probs per pack in the dataset",
        "  the parquet file is NOT for SFTTrainer: it would train on the rejected completions too",
    ]


def write(job: ExportJob) -> tuple[list[str], dict[str, Any]]:
    store = job.store
    name = trl_name(store.split, store.size)
    stream_parquet(job.staged.path(name), "trl", store, columns, job.progress)
    if is_preference(store.metadata):
        return dpo_recipe(store.directory, store.size), {"tokens_per_row": store.size, "preference": True}
    lines = sft_recipe(job.directory / name, store.size)
    return lines, {"tokens_per_row": store.size}


EXPORTER = Exporter(
    target=ExportTarget.TRL,
    files="`{S}_{N}.parquet` (input_ids, labels, seq_lengths)",
    reader='TRL `SFTTrainer(padding_free=True)` through `datasets.load_dataset("parquet")`',
    file_names=file_names,
    check=check,
    write=write,
)
