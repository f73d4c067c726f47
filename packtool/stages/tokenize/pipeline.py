"""`tokenize_corpus`: plan chunks, tokenize the missing ones, append them to the store in order.

1. Start loading the fast engine (a background thread), load the reference tokenizer, plan the
   chunks (independent of workers), start hashing the inputs (another background thread), verify
   the fast engine on a sample. Each tokenizer is loaded once and shared by every chunk thread.
2. Chunks already in the journal of `.{DIR}.partial/` are kept when their key, their inputs and
   their bytes still match (resume).
3. The executor runs the others (threads by default: the tokenizers release the GIL) and yields
   them in order, at most a few chunks ahead; each result's ids are appended to the store in
   `.{DIR}.partial/store/` at once, hashed as they are written, and journaled.
4. The manifest (per-file sha256 taken while writing, input sha256 from step 1) is written and
   the store renamed into place: a kill at any point leaves nothing under DIR, and a re-run
   resumes from the journal and ends with the same bytes.

Every byte is written once and read never: no chunk files, no stitching, no hashing pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packtool import __version__
from packtool.choices import OnError
from packtool.core.encoding.backends import FastBackend, HFBackend
from packtool.errors import FormatError, PacktoolError
from packtool.exec import Executor, cap_malloc_arenas, make_executor, scoped_environ
from packtool.formats.faults import fault_point
from packtool.formats.token_resume import resume_token_store
from packtool.formats.token_store import MANIFEST, StoreMark, TokenStoreWriter, commit_token_store, dtype_for_max_id
from packtool.progress import Progress
from packtool.stages.tokenize.backend_choice import (
    choose_backend,
    fast_candidate,
    input_sample,
    preload_fast,
    remember_backend,
)
from packtool.stages.tokenize.chunks import ChunkTask, prerender, worker_env
from packtool.stages.tokenize.config import TokenizeConfig, auto_chunk_bytes
from packtool.stages.tokenize.engine.early import worth_loading
from packtool.stages.tokenize.engine.locate import Located, locate_model
from packtool.stages.tokenize.engine.model import Model, load_model
from packtool.stages.tokenize.engine.tokenizer import TokenizerInfo, remember_tokenizer
from packtool.stages.tokenize.inputs.chunk import Chunk
from packtool.stages.tokenize.inputs.locators import expand_inputs
from packtool.stages.tokenize.inputs.locators.hub import HubOptions
from packtool.stages.tokenize.inputs.plan import SourceHashes, input_bytes, plan_chunks
from packtool.stages.tokenize.journal import ChunkResult, Journal, work_dir_for
from packtool.stages.tokenize.manifest import token_manifest
from packtool.stages.tokenize.output import check_output, guarded_output
from packtool.stages.tokenize.settings import ChunkSettings, chunk_settings
from packtool.stages.tokenize.shape import resolve_shape
from packtool.stages.tokenize.shards import shard_build, shard_entry, shard_slice

log = logging.getLogger(__name__)

#: chunks run ahead of the oldest one not yet appended, per worker (bounds the results held in memory)
AHEAD_PER_WORKER = 2


@dataclass(frozen=True)
class TokenizeResult:
    """The finished store and how it was made."""

    path: Path
    manifest: dict[str, Any]
    n_chunks: int
    reused_chunks: int
    up_to_date: bool = False


def tokenize_corpus(
    config: TokenizeConfig,
    progress: Progress | None = None,
    executor: Executor | None = None,
    located: Located | None = None,
) -> TokenizeResult:
    """Tokenize `config.inputs` into the token store `config.output` (see the module docstring).

    `progress(done_bytes, total_bytes)` is called after each chunk. `located`: where `--tokenizer` was found
    (`early.start_fast_load`); the model folder is looked up once and everything is loaded from it.
    """
    config.validate()
    output = Path(config.output).expanduser().resolve()
    workers = config.resolved_workers()
    cap_malloc_arenas()  # before the first thread: see packtool.exec.local
    with scoped_environ(worker_env(workers) if executor is None and config.executor == "local" else {}):
        located = located or _located(config.tokenizer)
        fast = _preload_fast(config, located)
        model = load_model(config.tokenizer, located, progress)
        hub = HubOptions(config.subset, config.split, progress)
        paths = expand_inputs(config.inputs, hub)
        drops: list[Callable[[], None]] = []
        try:
            with guarded_output(output):
                return _tokenize(config, output, model, paths, fast, progress, executor, drops, hub.resolved)
        finally:
            for drop in drops:  # chunks rendered ahead that no task took (resumed, up to date, failed)
                drop()


def _located(spec: str) -> Located | None:
    """Where `--tokenizer` is, when the run was not handed it; None: `load_model` downloads it or reports why."""
    try:
        return locate_model(spec)
    except (PacktoolError, OSError):
        return None


def _preload_fast(config: TokenizeConfig, located: Located | None) -> Future[FastBackend] | None:
    """Start loading the fast engine when the run may use it; a bad --tokenizer is load_model's to report."""
    if not fast_candidate(config.backend) or located is None:
        return None
    try:
        path = located.tokenizer_json.resolve()
    except OSError:
        return None
    if not worth_loading(path, config.format):  # offsets, which fast cannot give for this tokenizer (early.py)
        return None
    return preload_fast(str(path))


def _tokenize(
    config: TokenizeConfig,
    output: Path,
    model: Model,
    paths: list[Path],
    fast: Future[FastBackend] | None,
    progress: Progress | None,
    executor: Executor | None,
    drops: list[Callable[[], None]],
    hub: list[dict[str, Any]],
) -> TokenizeResult:
    """The write phase, under the output's lock (`output.guarded_output`); `drops` collects what to free after."""
    tok, info = model.tokenizer, model.info
    workers = config.resolved_workers()
    remember_tokenizer(info.path, info.sha256, tok)
    chunk_bytes = config.chunk_bytes or auto_chunk_bytes(input_bytes(paths))
    sources, all_chunks = plan_chunks(paths, max(1, int(chunk_bytes)))
    hashes = SourceHashes(sources)  # in the background, file by file
    chunks = shard_slice(all_chunks, config.num_shards, config.shard_index)  # all of them unless sharded
    shape = resolve_shape(config, all_chunks)
    needs_offsets = shape.loss and not shape.spec.pairs  # target spans are character offsets (pairs: tokens)
    settings = replace(chunk_settings(config, info, output, shape), vision=model.vision)

    def meanwhile(pending: Callable[[], bool]) -> None:  # render chat-shaped chunks while the fast engine loads
        if shape.spec.loss and executor is None and config.executor == "local":
            drops.append(prerender(chunks, settings, pending))

    choice = choose_backend(
        config.backend,
        tok,
        info.path,
        lambda: input_sample(all_chunks, settings),
        settings.policy.add_special_tokens,
        needs_offsets,
        fast,
        meanwhile,
    )
    log.info("tokenizer backend: %s (%s)", choice.name, choice.reason)
    remember_backend(choice.name, info.path, info.sha256, choice.engine or HFBackend(tok))
    settings = replace(settings, backend=choice.name)
    fingerprint = hashlib.sha256(f"{__version__}|{settings.fingerprint()}".encode()).hexdigest()

    def build() -> tuple[str, dict[str, Any] | None]:
        digest = hashes.result()
        full = hashlib.sha256(json.dumps([fingerprint, [(s.path, digest[s.path]) for s in sources]]).encode())
        if config.num_shards == 1:
            return full.hexdigest(), None
        entry = shard_entry(full.hexdigest(), len(all_chunks), config.num_shards, config.shard_index)
        return shard_build(full.hexdigest(), config.num_shards, config.shard_index), entry

    existing = check_output(output, build()[0] if (output / MANIFEST).is_file() else "", config.overwrite, paths)
    if existing is not None:  # the inputs' hashes were waited for only because a store is there
        return TokenizeResult(output, existing, len(chunks), len(chunks), up_to_date=True)
    journal = Journal(work_dir_for(output), fingerprint)
    try:
        writer, kept = _resume(journal, chunks, fingerprint, hashes, settings, info)
    except BaseException:
        journal.close()
        raise
    try:
        results = {r.index: r for r in kept}
        tasks = [ChunkTask(c, settings, _chunk_key(fingerprint, c)) for c in chunks[len(kept) :]]
        run = executor or make_executor(
            config.executor,
            workers,
            ray_address=config.ray_address,
            worker_env=worker_env,
            ahead=AHEAD_PER_WORKER * workers + 1,
        )
        _append_in_order(run, tasks, writer, journal, results, hashes, chunks, progress)
        build_id, shard = build()
        for path, digest in hashes.result().items():  # a kill before the commit below still resumes
            if path not in journal.source_hashes:
                journal.record_source(path, digest)
        manifest = token_manifest(
            chunks, results, sources, hashes.result(), settings, info, config, build_id, choice.manifest(), shape
        )
        if writer.media is not None:  # a store with images: its `vision` object, counts filled by `finish`
            processor = model.processor
            manifest["vision"] = writer.media.vision(processor.family, processor.config, processor.image_token_id)
        manifest = {**manifest, **({"hub": hub} if hub else {})}  # each hf:// input: repo, revision, commit
        manifest = writer.finish({**manifest, **({"shard": shard} if shard else {})})  # shard last: merge drops it
    except BaseException:
        writer.close()
        journal.close()
        raise
    commit_token_store(journal.store_dir, output)
    journal.remove()
    log.info(
        "tokenized %d documents, %d tokens into %s (%d/%d chunks reused)",
        manifest["n_documents"],
        manifest["n_tokens"],
        output,
        len(kept),
        len(chunks),
    )
    return TokenizeResult(output, manifest, len(chunks), len(kept))


def _resume(
    journal: Journal,
    chunks: list[Chunk],
    fingerprint: str,
    hashes: SourceHashes,
    settings: ChunkSettings,
    info: TokenizerInfo,
) -> tuple[TokenStoreWriter, list[ChunkResult]]:
    """Open the store in the work directory at the longest journaled prefix that still holds."""
    prefix: list[ChunkResult] = []
    marks: list[StoreMark] = []
    current: dict[str, str] = {}  # the digests checked: those of the files the kept chunks read
    if journal.done:  # a resume: only now are the inputs' hashes waited for, those of the prefix's files
        for chunk in chunks:
            done = journal.done.get(chunk.index)
            if done is None or done.key != _chunk_key(fingerprint, chunk) or done.mark is None:
                break
            if any(p not in journal.source_hashes for p in chunk.paths):
                break  # killed before this file's digest was journaled: its chunks cannot be trusted
            current.update({p: hashes.get(p) for p in chunk.paths if p not in current})
            if any(journal.source_hashes[p] != current[p] for p in chunk.paths):
                break
            try:
                marks.append(StoreMark.from_json(done.mark))
            except FormatError:
                break
            prefix.append(done)
    writer, kept = resume_token_store(
        journal.store_dir,
        dtype_for_max_id(info.max_id),
        marks,
        with_loss=settings.loss,
        with_rejects=settings.on_error == OnError.SKIP,
        with_media=settings.vision is not None,  # the images resume with the tokens
    )
    journal.restart(prefix[:kept], {p: h for p, h in current.items() if journal.source_hashes.get(p) == h})
    return writer, prefix[:kept]


def _append_in_order(
    run: Executor,
    tasks: list[ChunkTask],
    writer: TokenStoreWriter,
    journal: Journal,
    results: dict[int, ChunkResult],
    hashes: SourceHashes,
    chunks: list[Chunk],
    progress: Progress | None,
) -> None:
    """Append each chunk's ids to the store in chunk order as results come (any order), journaling each."""
    total = sum(c.n_bytes for c in chunks)
    done_bytes = sum(r.n_bytes for r in results.values())
    if progress:
        progress(done_bytes, total)
    order = [t.chunk.index for t in tasks]
    waiting: dict[int, ChunkResult] = {}
    position = 0
    for result in run(tasks):
        waiting[result.index] = result
        while position < len(order) and order[position] in waiting:
            ready = waiting.pop(order[position])
            position += 1
            fault_point("tokenize.chunk:commit")
            first = writer.n_documents
            for ids, lengths, loss in ready.parts:
                writer.append(ids, lengths, loss)
            for doc, offset, n_tokens, grid, n_patches, data in ready.media:  # after its documents: global index
                writer.media.add(first + doc, offset, n_tokens, grid, n_patches, data)  # type: ignore[union-attr]
            writer.append_rejects(ready.rejects)
            ready.mark = writer.mark().to_json()
            ready.release()
            journal.record(ready)
            results[ready.index] = ready
            done_bytes += ready.n_bytes
            if progress:
                progress(done_bytes, total)
        for path, digest in hashes.newly_done():  # as soon as known: a resume needs them to trust the chunks
            if path not in journal.source_hashes:
                journal.record_source(path, digest)
    if position != len(order):
        raise FormatError(f"the executor returned {position} of {len(order)} chunks, tokenize, this is a bug")


def _chunk_key(fingerprint: str, chunk: Chunk) -> str:
    """What a chunk's output depends on besides its inputs' bytes (those are checked by their sha256)."""
    ident = [fingerprint, chunk.kind, chunk.start, chunk.end, chunk.first_line, list(chunk.paths)]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()
