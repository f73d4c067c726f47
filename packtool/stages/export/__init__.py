"""`packtool export`: a pack store rewritten in a trainer's own format, row/instance i = pack i.

Life of the stage: `ExportConfig.validate()` -> open and check the split (`formats.pack_store`) ->
the target's `Exporter` (the contract in `config.py`, listed in `registry.EXPORTERS`) checks what
its trainer cannot represent (and refuses with a sentence) -> blocks of packs are re-expressed in
the trainer's convention and streamed to hidden temp files (`formats.exports.StagedExport`) -> one
commit renames them. The output directory is locked for the whole run
(`formats.locks.exclusive_output`): a second export into it fails at once. Every exporter starts
from the same view of a pack (`blocks.PackBlock`: tokens plus the loader's target mask), which is what makes "the
trainer sees what packtool's loader sees" checkable pack by pack (tests/interop).

The library never prints: `ExportResult.lines` holds the trainer config lines and numbers the CLI
shows (docs/EXPORT.md explains every format and decision).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import ConfigError, UsageError
from packtool.formats.exports import StagedExport
from packtool.formats.locks import exclusive_output
from packtool.formats.oserrors import writing
from packtool.formats.pack_store import (
    PackSplit,
    find_pack_dir,
    metadata_sources,
    open_pack_split,
    parse_data_name,
    sizes_in,
)
from packtool.formats.token_store import MANIFEST
from packtool.progress import Progress
from packtool.stages.export.config import ExportConfig, Exporter, ExportJob, ExportResult, ExportTarget, TokenizerIds
from packtool.stages.export.registry import EXPORTERS, exporter

log = logging.getLogger(__name__)


def export_store(config: ExportConfig, progress: Progress | None = None) -> ExportResult:
    """Write one split of a pack store in `config.to`'s format under `config.output`, atomically."""
    spec = exporter(config.validate().target)
    target = spec.target
    directory, split, size = _resolve(config)
    output = Path(config.output)
    if output.resolve() == directory.resolve():
        raise ConfigError(
            f"--output is the pack directory itself, {output}, choose another directory (export file names would clash with the store's)"
        )
    if (output / MANIFEST).is_file():
        raise ConfigError(
            f"--output is a token store, {output}, choose another directory (an export never writes into a store)"
        )
    store = open_pack_split(directory, split, size)
    if store.preference is not None and spec.preference_recipe is not None:
        # the trainer reads the pack store itself: writing its SFT files would hand it the pairs as plain sequences
        lines = spec.preference_recipe(directory, size)
        return ExportResult(target, output, (), store.n_packs, size, tuple(lines), {"preference": True})
    check_preference(store, spec)  # a pair store read as plain SFT packs is a silent wrong answer
    if store.images is not None:  # the trainers' packed formats carry no pixels: the images would be lost
        raise ConfigError(
            f"{store.split}_{store.size} in {store.directory} holds images, --to {spec.target.value}, whose files carry "
            "no pixels or image grids (the image tokens would train on nothing); train on the packs with packtool's "
            "loader (PackedDataset + PackedCollator, docs/VISION.md)"
        )
    ids = _tokenizer_ids(store, config.eos_id)
    spec.check(store, ids)  # refuse what the trainer cannot represent before writing anything
    names, shared = spec.file_names(split, size)
    log.info("exporting %d packs of %s to %s in %s", store.n_packs, directory, target, output)
    # a read-only or full file system is one line (it was an OSError traceback), and nothing is left
    with writing(output), exclusive_output(output), StagedExport(output, names, shared, config.overwrite) as staged:
        job = ExportJob(store, ids, staged, output, progress)
        lines, numbers = spec.write(job)
    return ExportResult(
        target,
        output,
        tuple(output / n for n in names + shared),
        store.n_packs,
        size,
        tuple(lines),
        numbers,
    )


def check_preference(store: PackSplit, spec: Exporter) -> None:
    """Refuse a preference pack store (its metadata's `preference` key, read through `formats.pack_store`) in a
    layout `spec`'s trainer cannot read exactly, naming what trains on it instead."""
    pref = store.preference
    if pref is not None:
        refuse_layout(str(pref.get("layout")), spec, f"{store.split}_{store.size} in {store.directory}")


def refuse_layout(layout: str, spec: Exporter, where: str) -> None:
    """The ConfigError of `check_preference` for a preference pack `layout` ("pairs" / "shared-prompt") that
    `spec` cannot export; nothing when it can (also what `packtool run` checks before its first step)."""
    if layout in spec.preference_layouts or spec.preference_recipe is not None:
        return
    target = spec.target.value
    if spec.preference_layouts:  # the target reads pairs, but not this layout
        raise ConfigError(
            f"{where} is a preference pack store with a shared prompt (layout {layout}), --to {target}, its files "
            "cannot say that both completions continue one prompt (their positions and attention would restart "
            "at the completion): train on the packs with packtool's loader (PackedDataset + PackedCollator, "
            "packtool.loss.pair_logps; TRL: docs/HF.md) or re-pack without --share-prompt"
        )
    lost = " and lose the prompt they share" if layout == "shared-prompt" else ""
    raise ConfigError(
        f"{where} is a preference pack store (layout {layout}), --to {target}, which has no packed preference "
        f"(DPO) format: it would read chosen and rejected as unrelated SFT sequences{lost}; train on the packs with "
        "packtool's loader (PackedDataset + PackedCollator, packtool.loss.pair_logps) or TRL (docs/HF.md)"
    )


def _resolve(config: ExportConfig) -> tuple[Path, str, int]:
    """(pack directory, split, size) from the forms `PackedDataset` accepts."""
    p = Path(config.path)
    split, size = config.split, config.size
    if not p.exists():
        raise ConfigError(f"no pack store at {p}, PACK_PATH, pass a pack ROOT, a packed/{{tokenizer}} dir or a .npy")
    if p.is_file():
        parsed = parse_data_name(p.name)
        if parsed is None:
            raise ConfigError(
                f"{p.name} is not a pack file named {{split}}_{{N}}.npy, {p}, pass the pack directory or a {{split}}_{{N}}.npy file"
            )
        if size is not None and size != parsed[1]:
            raise ConfigError(
                f"--size {size} contradicts the file name {p.name}, {p}, drop --size or pass the matching file"
            )
        split, size = parsed
    directory = find_pack_dir(p)
    sizes = sizes_in(directory)
    found = ", ".join(map(str, sizes)) or "none"
    if size is None:
        if len(sizes) != 1:
            raise ConfigError(f"pack directory holds sizes {found}, {directory}, pass --size N to choose one")
        size = sizes[0]
    elif size not in sizes:
        raise ConfigError(
            f"no packs of size {size} (found {found}), {directory}, pass one of those or run `packtool pack --size {size}`"
        )
    return directory, split, int(size)


def _tokenizer_ids(store: PackSplit, eos_override: int | None) -> TokenizerIds:
    """Pad id from the pack metadata; EOS id and vocabulary size from the source token store if still there.

    The manifest is trusted only when its sha256 equals the one the pack metadata recorded (the
    token store may have been re-tokenized since); `--eos-id` overrides.
    """
    meta = store.metadata
    pad_id = int(meta.get("pad_id", 0))
    manifest: dict[str, Any] = {}
    sources = metadata_sources(meta)
    source = sources[0] if sources else {}  # a mixture's stores share the tokenizer: the first one's ids
    mpath = Path(str(source.get("path", ""))) / MANIFEST
    if source.get("path") and mpath.is_file():
        raw = mpath.read_bytes()
        if hashlib.sha256(raw).hexdigest() == source.get("manifest_sha256"):
            manifest = json.loads(raw)
        else:
            log.warning("token store manifest %s changed since packing; not using its token ids", mpath)
    tok = manifest.get("tokenizer", {})
    if eos_override is not None:  # an id the store cannot hold would be written into every trainer's files
        vocab = tok.get("vocab_size") if isinstance(tok.get("vocab_size"), int) else None
        limit = vocab if vocab is not None else int(np.iinfo(store.tokens.dtype).max) + 1
        if eos_override >= limit:
            what = (
                f"the tokenizer's vocabulary of {vocab}"
                if vocab is not None
                else f"the store's {store.tokens.dtype} ids"
            )
            raise UsageError(
                f"--eos-id {eos_override} is not a token id of {what}, {store.directory}, pass an id below {limit}"
            )
    eos = eos_override if eos_override is not None else tok.get("eos_id")
    return TokenizerIds(
        pad_id=pad_id,
        eos_id=eos if isinstance(eos, int) else None,
        vocab_size=tok.get("vocab_size") if isinstance(tok.get("vocab_size"), int) else None,
    )


__all__ = ["EXPORTERS", "ExportConfig", "ExportResult", "ExportTarget", "Exporter", "export_store"]
