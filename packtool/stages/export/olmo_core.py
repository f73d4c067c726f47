"""`--to olmo-core`: raw `{S}_{N}.npy` tokens + raw bool `{S}_{N}.label_mask.npy`, for `NumpyFSLDataset`.

OLMo-core 3.0 reads headerless arrays (`np.memmap`, the dtype given to the dataset) and cuts them
into instances of `sequence_length` tokens: with `sequence_length=N` instance i is pack i. It finds
documents by EOS (`generate_doc_lengths=True`: a document ends at each EOS, and a trailing run
without EOS is one more document, ended by the instance boundary). So a segment without a final
EOS is read correctly when it is the last segment of its pack: the head fragments that
`--overlong split` cuts (and `truncate` keeps) fill a pack alone, so they export as they are; in
front of tail padding the pad run joins that last document, which changes no real token's
attention (padding comes after it and is never a target). Refused, with the fix: a segment
without EOS followed by another segment of the same pack (OLMo-core would join the two), an EOS
inside a segment (it would split there), a tail pad id equal to EOS, and `--pad-multiple`
padding (it would join the next document). `label_mask` is
unshifted (True = this token is a target; OLMo-core masks then shifts), False at every segment's
first token and on padding: `get_labels` then equals the loader's labels shifted by one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.choices import ExportTarget
from packtool.errors import ConfigError
from packtool.formats.exports import olmo_label_mask_name, olmo_tokens_name
from packtool.formats.pack_store import PackSplit
from packtool.stages.export.blocks import PackBlock, iter_blocks
from packtool.stages.export.config import Exporter, ExportJob, TokenizerIds


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
    """Refuse what OLMo-core's EOS scan would misread (vectorised over the block's segments).

    A segment that does not end with EOS is fine as the last (non-empty) segment of its pack,
    never in front of another one; an EOS anywhere but at a segment's last token is refused.
    """
    flat = block.tokens.reshape(-1)
    rows = np.repeat(np.arange(block.n_packs, dtype=np.int64), block.counts)
    real = np.flatnonzero(block.seg_len > 0)  # packtool writes no empty segments; be safe anyway
    ends_eos = flat[(block.seg_flat() + block.seg_len - 1)[real]] == eos_id
    followed = np.zeros(real.size, dtype=bool)
    followed[:-1] = rows[real[:-1]] == rows[real[1:]]  # the next segment sits in the same pack
    bad = ~ends_eos & followed
    if bad.any():
        first = int(real[np.flatnonzero(bad)[0]])
        pack = block.p0 + int(rows[first])
        in_pack = first - int(np.searchsorted(rows, rows[first]))
        raise ConfigError(
            f"{int(bad.sum())} sequences do not end with EOS ({eos_id}) yet are followed by another sequence in the same "
            f"pack (first: pack {pack}, sequence {in_pack} of it), {store.directory}, OLMo-core finds documents by EOS "
            "and would join them: tokenize with --eos (a fragment without EOS is read correctly only as the last "
            "sequence of its pack, as --overlong split and truncate leave it) or train with packtool's loader"
        )
    n_eos = int(np.count_nonzero(block.tokens == eos_id))
    if n_eos != int(np.count_nonzero(ends_eos)):
        raise ConfigError(
            f"{n_eos - int(np.count_nonzero(ends_eos))} EOS tokens ({eos_id}) sit inside sequences of packs "
            f"{block.p0}..{block.p1 - 1}, {store.directory}, OLMo-core would split those documents there: remove EOS "
            "from inside documents (e.g. a chat template whose end-of-turn is EOS) or train with packtool's loader"
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


EXPORTER = Exporter(
    target=ExportTarget.OLMO_CORE,
    files="raw `{S}_{N}.npy` tokens + raw bool `{S}_{N}.label_mask.npy`",
    reader="OLMo-core `NumpyFSLDataset(generate_doc_lengths=True)`",
    file_names=file_names,
    check=check,
    write=write,
)
