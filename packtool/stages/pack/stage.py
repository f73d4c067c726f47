"""`pack_store`: token store -> segments -> packs -> `{split}_{N}.npy` + companions + metadata line.

config (validated) -> plan (`build_segments`, `plan_layout`) -> tasks (`block_tasks`, run by an
executor from `packtool.exec`) -> commit (`PackSplitWriter`, metadata line last). Only index
arrays (a few int64 per segment) live in memory; tokens never pass through Python. Same input +
seed -> byte-identical files for every `--workers` and executor.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from packtool import __version__
from packtool.core.packing import lower_bound
from packtool.core.packing.segments import Segments, build_segments
from packtool.errors import ConfigError, FormatError
from packtool.exec import make_executor, worker_count
from packtool.formats.faults import fault_point
from packtool.formats.locks import exclusive_output
from packtool.formats.oserrors import writing
from packtool.formats.pack_store import MIXTURE_VERSION, pack_dir, read_metadata
from packtool.formats.pack_writer import PackSplitWriter, pack_dir_made, publish_together
from packtool.formats.store_set import StoreSet, open_store_set
from packtool.formats.token_store import TokenStore, dtype_name, open_token_store
from packtool.progress import Progress
from packtool.signals import signals_deferred
from packtool.stages.pack.blocks import block_tasks
from packtool.stages.pack.config import PackConfig
from packtool.stages.pack.layout import Layout, pad_id_for, plan_layout
from packtool.stages.pack.mixture import (
    SplitSelection,
    check_repetition,
    held_out_of,
    mixture_record,
    select_splits,
    source_records,
)
from packtool.stages.pack.pairs import (
    as_segments,
    check_pair_config,
    global_scan,
    is_preference,
    pair_items,
    pair_lower_bound,
    plan_pair_layout,
    preference_record,
    selected_pairs,
)
from packtool.stages.pack.vision import VisionPlan, plan_vision, vision_companions, vision_key, vision_record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackResult:
    """What `pack_store` wrote: the directory and the metadata line (every number in it)."""

    directory: Path
    metadata: dict[str, Any]
    validation: dict[str, Any] | None = None  # the validation split's line of a `--validation` run


def _write_matrices(
    layout: Layout,
    stores: StoreSet,
    writer: PackSplitWriter,
    config: PackConfig,
    pad_id: int,
    progress: Progress | None,
) -> None:
    """Fill `{S}_{N}.npy` (and `.loss.npy`) block by block through the chosen executor."""
    if layout.n_packs == 0:
        return
    workers = worker_count(config.workers, config.executor, config.ray_address)
    execute = make_executor(config.executor, workers, ray_address=config.ray_address)
    tasks = block_tasks(layout, stores, writer, config.size, pad_id, sync=str(config.executor) == "ray")
    done = 0
    for p0, p1 in execute(tasks):
        done += p1 - p0
        if progress is not None:
            progress(done, layout.n_packs)


def _metadata(config: PackConfig, store: TokenStore, segments: Segments, layout: Layout, pad_id: int) -> dict[str, Any]:
    """The metadata line: Megatron-Bridge's keys (same definitions) plus packtool's provenance."""
    size, n_packs = config.size, layout.n_packs
    lengths = layout.lengths
    per_pack_tokens = (
        np.add.reduceat(lengths, layout.pack_offsets[:-1]) if n_packs and lengths.size else np.zeros(n_packs, np.int64)
    )
    per_pack_count = np.diff(layout.pack_offsets)
    n_tokens = int(layout.real.sum())
    tok = store.manifest.get("tokenizer", {})
    return {
        # Megatron-Bridge (packing_utils.create_packing_strategy): lengths include --pad-multiple padding
        "pack_size": size,
        "max_samples_per_bin": int(per_pack_count.max()) if n_packs else 0,
        "dataset_max_seqlen": int(lengths.max()) if lengths.size else 0,
        "min_packed_seqlen": int(per_pack_tokens.min()) if n_packs else 0,
        "packing_factor": round(len(segments) / n_packs, 2) if n_packs else 0.0,
        "packing_efficiency": round(float(lengths.sum()) / n_packs / size * 100, 2) if n_packs else 0.0,
        # packtool
        "split": str(config.split),
        "algorithm": str(config.algorithm),
        "seed": config.seed,
        "shuffle": config.shuffle,
        "tokenizer": {"name": tok.get("name"), "sha256": tok.get("sha256")},
        "vocab_size": tok.get("vocab_size"),
        "source": {"path": str(store.path.resolve()), "manifest_sha256": store.manifest_sha256},
        "dtype": dtype_name(store.dtype),
        "pad_id": pad_id,
        "pad_multiple": config.pad_multiple,
        "max_docs_per_pack": config.max_docs_per_pack,
        "n_documents": store.n_documents,
        "n_segments": len(segments),
        "n_packs": n_packs,
        "n_tokens": n_tokens,
        "n_pad_tokens": n_packs * size - n_tokens,
        "n_dropped_tokens": segments.n_dropped_tokens,
        "lower_bound_packs": lower_bound(lengths, size, config.max_docs_per_pack),
        "overlong": {"policy": str(config.overlong), "count": segments.n_overlong},
        "n_empty_documents": segments.n_empty,
        "packtool_version": __version__,
    }


def pack_store(config: PackConfig, progress: Progress | None = None) -> PackResult:
    """Pack a token store (or a mixture of several) into `ROOT/packed/{tokenizer}/{split}_{N}.*`.

    With `validation`, the held-out documents go to `validation_N` in the same run (its own build and
    metadata line; both lines are committed by one metadata rewrite, so an interrupted run leaves both
    splits as they were or both new). Refuses a token store whose manifest, sizes
    or sha256 do not check out (FormatError), and stores of different tokenizers (TokenizerError).
    """
    config.validate()
    specs = config.stores()
    first = open_token_store(specs[0][0])
    if config.is_mixture:  # weights whose repetition cannot fit in memory: refused before anything is created
        counts = [first.n_documents, *(open_token_store(p).n_documents for p, _ in specs[1:])]
        check_repetition([p for p, _ in specs], [w for _, w in specs], counts)
    directory = pack_dir(config.output, first.tokenizer_name)
    with writing(directory), pack_dir_made(directory) as made, exclusive_output(made):  # one writer per directory
        _check_validation_owner(directory, config)
        stores = open_store_set([p for p, _ in specs], check_hashes=True)
        preference = is_preference(stores)
        check_pair_config(config, preference)
        vision = vision_key(stores, config, preference)  # None: text-only stores, packed exactly as before
        selections: list[SplitSelection | None] = [None]
        if config.is_mixture:
            with signals_deferred():
                selections = list(
                    select_splits(
                        stores, [w for _, w in specs], config.seed, config.validation, str(config.split), preference
                    )
                )
        with signals_deferred():  # compiled: first target and common prefix of every pair, once for both splits
            scan = global_scan(stores) if preference else None
        with contextlib.ExitStack() as stack:  # any failure aborts every writer: no split is committed
            staged = [_write_split(config, stores, sel, progress, stack, scan, vision) for sel in selections]
            for writer, meta, salt in staged:
                writer.commit(meta, salt, publish=False)
            records = publish_together([writer for writer, _, _ in staged], _stale_validation(directory, config))
    return PackResult(directory, records[0], records[1] if len(records) > 1 else None)


def _check_validation_owner(directory: Path, config: PackConfig) -> None:
    """`--validation` rewrites `validation_N`: refuse when the one there was held out of another split that is
    still there (`--split test` after a `--validation` run of training). Replacing it would leave that split
    beside a validation split not held out of it, which a trainer would take for its pair."""
    if config.validation is None:
        return
    try:
        lines = read_metadata(directory, config.size)
    except FormatError:
        return  # an unreadable metadata file is the writer's to report
    splits = {str(r["split"]) for r in lines}
    for record in lines:
        owner = held_out_of(record)
        if owner is not None and owner != str(config.split) and owner in splits:
            n = config.size
            raise ConfigError(
                f"{directory} holds {record['split']}_{n}, held out of {owner}_{n}: --validation with --split "
                f"{config.split} would replace it and leave {owner}_{n} without its held-out documents, "
                f"pack into another --output, or re-pack {owner} without --validation first"
            )


def _stale_validation(directory: Path, config: PackConfig) -> tuple[str, ...]:
    """A validation split held out of the split this run rewrites without `--validation`: its documents are
    all in the new training split now, so its line goes in the same commit (under the directory's lock)."""
    if config.validation is not None:
        return ()  # this run writes its own validation split
    try:
        lines = read_metadata(directory, config.size)
    except FormatError:
        return ()  # an unreadable metadata file is the writer's to report
    return tuple(r["split"] for r in lines if held_out_of(r) == str(config.split))


def _write_split(
    config: PackConfig,
    stores: StoreSet,
    selection: SplitSelection | None,
    progress: Progress | None,
    stack: contextlib.ExitStack,
    scan: np.ndarray | None = None,
    vision: dict[str, Any] | None = None,
) -> tuple[PackSplitWriter, dict[str, Any], str | None]:
    """Segments -> layout -> matrices of one split (the stores' documents, or a selection of them), written
    under temp names by a writer entered into `stack`; returns it with the split's metadata and build salt.
    `scan` (preference stores: `pairs.global_scan`) makes each pair one packing item."""
    directory = pack_dir(config.output, stores.first.tokenizer_name)
    store = stores.first
    split = str(config.split) if selection is None else selection.split
    role: np.ndarray | None = None
    plan: VisionPlan | None = None
    with signals_deferred():  # compiled planning: signals land after it, never in numba's return path
        if scan is not None:
            docs = None if selection is None else selection.docs
            items = pair_items(stores, selected_pairs(docs, stores.n_documents // 2), scan, config)
            layout, role = plan_pair_layout(items, config)
            lengths = stores.lengths if docs is None else stores.lengths[docs]
            segments = as_segments(items, int(np.count_nonzero(lengths == 0)))
        elif vision is not None:  # images whole, both capacities (`stages.pack.vision`)
            docs = None if selection is None else selection.docs
            starts, lengths = (
                (stores.starts, stores.lengths) if docs is None else (stores.starts[docs], stores.lengths[docs])
            )
            plan = plan_vision(stores, docs, starts, lengths, config)
            segments, layout = plan.segments.segments, plan.layout
            if docs is not None:
                segments = replace(segments, doc=docs[segments.doc])
                layout = replace(layout, doc=docs[layout.doc])
        elif selection is None:
            segments = build_segments(store.starts, store.lengths, config.size, config.overlong, config.pad_multiple)
        else:
            docs, starts, lengths = selection.docs, stores.starts, stores.lengths
            segments = build_segments(starts[docs], lengths[docs], config.size, config.overlong, config.pad_multiple)
            segments = replace(segments, doc=docs[segments.doc])
        if role is None and plan is None:
            layout = plan_layout(segments, config)
    pad_id = pad_id_for(store)
    log.info("packing %d segments of %s into %d packs of %d", len(segments), split, layout.n_packs, config.size)
    writer = stack.enter_context(
        PackSplitWriter(
            directory,
            split,
            config.size,
            store.dtype,
            layout.n_packs,
            stores.has_loss,
            n_segments=len(segments),
            with_pairs=role is not None,
            with_vision=plan is not None,
        )
    )
    _write_matrices(layout, stores, writer, config, pad_id, progress)
    fault_point("pack.fill.after")
    companions = {
        "pack_offsets": layout.pack_offsets,
        "seg_lens": layout.lengths,
        "seg_pad": layout.pad,
        "seg_doc": layout.doc,
        "seg_src": layout.src,
    }
    if role is not None:
        companions["seg_pair"] = layout.doc // 2
        companions["seg_role"] = role
    images = vision_companions(plan, config.size) if plan is not None else {}
    companions.update(images)
    for what, values in companions.items():
        writer.write_companion(what, values)
    meta = _metadata(config, store, segments, layout, pad_id)
    if role is not None:
        meta["lower_bound_packs"] = pair_lower_bound(items, config)
        meta["preference"] = preference_record(items, config)
    if plan is not None and vision is not None:
        meta["vision"] = vision_record(vision, plan, images, config.vision_budget)
        meta["lower_bound_packs"] = plan.lower_bound
    if selection is None:
        return writer, meta, None
    weights = [w for _, w in config.stores()]
    sources = source_records(stores, weights, selection, config.validation)
    mixture = mixture_record(selection, config.validation, str(config.split))
    meta.update(
        split=split,
        source=sources,
        mixture=mixture,
        n_documents=int(selection.docs.size),
        format_version=MIXTURE_VERSION,
    )
    spec = json.dumps(
        {"sources": [[s["manifest_sha256"], s["weight"]] for s in sources], "mixture": mixture}, sort_keys=True
    )
    return writer, meta, hashlib.sha256(spec.encode()).hexdigest()
