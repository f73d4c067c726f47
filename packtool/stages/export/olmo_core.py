"""`--to olmo-core`: raw `{S}_{N}.npy` tokens + raw bool `{S}_{N}.label_mask.npy`, for `NumpyFSLDataset`.

OLMo-core 3.0 reads headerless arrays (`np.memmap`, the dtype given to the dataset) and cuts them
into instances of `sequence_length` tokens: with `sequence_length=N` instance i is pack i. It finds
documents by EOS (`generate_doc_lengths=True`: a document ends at each EOS, and a trailing run
without EOS is one more document), so the export is exact only when every segment ends with EOS,
no EOS sits inside one, the tail padding is not EOS, and there is no `--pad-multiple` padding
(it would join the next document). Anything else is refused with the fix. `label_mask` is
unshifted (True = this token is a target; OLMo-core masks then shifts), False at every segment's
first token and on padding: `get_labels` then equals the loader's labels shifted by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.errors import ConfigError
from packtool.formats.exports import olmo_label_mask_name, olmo_tokens_name
from packtool.formats.pack_store import PackSplit
from packtool.stages.export.blocks import PackBlock, iter_blocks
from packtool.stages.export.config import ExportJob, TokenizerIds


def file_names(split: str, size: int) -> tuple[list[str], list[str]]:
    return [olmo_tokens_name(split, size), olmo_label_mask_name(split, size)], []


def check(store: PackSplit, ids: TokenizerIds) -> None:
    """Refuse, before writing, what the companions alone show OLMo-core cannot see as documents."""
    where = f"{store.split}_{store.size} in {store.directory}"
    if ids.eos_id is None:
        raise ConfigError(
            f"the EOS id of {where} is unknown (its source token store is gone or changed), --to olmo-core, pass --eos-id"
        )
    if bool(np.any(store.seg_pad)):
        raise ConfigError(
            f"{where} has --pad-multiple padding, which OLMo-core would count as part of the next document, "
            "re-pack without --pad-multiple"
        )
    if ids.pad_id == ids.eos_id:
        raise ConfigError(
            f"the pad id {ids.pad_id} of {where} is the EOS id, OLMo-core would count every tail pad token as a document, "
            "re-tokenize with a tokenizer that defines a pad token distinct from EOS"
        )


def check_block(block: PackBlock, eos_id: int, store: PackSplit) -> None:
    """Every segment ends with EOS and holds no other EOS (vectorised over the block)."""
    flat = block.tokens.reshape(-1)
    last = block.seg_flat() + block.seg_len - 1
    bad_end = flat[last] != eos_id
    if bad_end.any():
        seg = int(np.flatnonzero(bad_end)[0])
        pack = block.p0 + int(np.searchsorted(np.cumsum(block.counts), seg, side="right"))
        raise ConfigError(
            f"{int(bad_end.sum())} sequences do not end with EOS ({eos_id}) (first in pack {pack}), {store.directory}, "
            "OLMo-core finds documents by EOS: tokenize with --eos and pack with --overlong drop "
            "(split and truncate cut documents before their EOS)"
        )
    n_eos = int(np.count_nonzero(block.tokens == eos_id))
    if n_eos != block.seg_len.size:
        raise ConfigError(
            f"{n_eos - block.seg_len.size} EOS tokens ({eos_id}) sit inside sequences of packs {block.p0}..{block.p1 - 1}, "
            f"{store.directory}, OLMo-core would split those documents there: remove EOS from inside documents "
            "(e.g. a chat template whose end-of-turn is EOS) or train with packtool's loader"
        )


def write(job: ExportJob) -> tuple[list[str], dict[str, Any]]:
    store, ids = job.store, job.ids
    eos = int(ids.eos_id)  # type: ignore[arg-type]
    tok_name = olmo_tokens_name(store.split, store.size)
    mask_name = olmo_label_mask_name(store.split, store.size)
    dtype = np.dtype(store.tokens.dtype).newbyteorder("<")
    with open(job.staged.path(tok_name), "wb") as ftok, open(job.staged.path(mask_name), "wb") as fmask:
        for block in iter_blocks(store):
            check_block(block, eos, store)
            ftok.write(np.ascontiguousarray(block.tokens, dtype=dtype).tobytes())
            fmask.write(np.ascontiguousarray(block.target, dtype=np.bool_).tobytes())
            if job.progress is not None:
                job.progress(block.p1, store.n_packs)
    vocab = ids.vocab_size if ids.vocab_size is not None else "VOCAB_SIZE"
    np_dtype = "np.uint16" if dtype.itemsize == 2 else "np.uint32"
    lines = [
        f'OLMo-core: NumpyFSLDataset("{job.directory / tok_name}", sequence_length={store.size}, '
        f"pad_token_id={ids.pad_id}, eos_token_id={eos}, vocab_size={vocab}, dtype={np_dtype}, "
        f'generate_doc_lengths=True, label_mask_paths=["{job.directory / mask_name}"])',
        f"  instance i = pack i ({store.n_packs} instances); leave bos_token_id unset (documents are found by EOS alone)",
    ]
    return lines, {"instances": store.n_packs}
