"""`tokenize_corpus`: plan chunks, run the missing ones through an executor, stitch the store.

1. Load the tokenizer, expand and hash the inputs, cut them into chunks (independent of workers).
2. Chunks already in the journal of `.{DIR}.partial/` with a matching key are reused (resume).
3. The executor runs the others; each result is journaled the moment it arrives.
4. The chunk files are concatenated in chunk order into a staging directory through
   `write_token_store`, which renames into place: a kill at any point leaves nothing under
   DIR, and a re-run resumes from the journal and ends with the same bytes.

Disk: the work directory holds a second copy of the tokens until the store is complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from packtool import __version__
from packtool.choices import InputFormat, OnError
from packtool.errors import ConfigError, InputError
from packtool.exec import Executor, make_executor
from packtool.formats.token_store import REJECTS, dtype_for_max_id, dtype_name, write_token_store
from packtool.progress import Progress
from packtool.stages.tokenize.backend_choice import choose_backend, input_sample
from packtool.stages.tokenize.chunks import ChunkTask, worker_env
from packtool.stages.tokenize.config import TokenizeConfig
from packtool.stages.tokenize.journal import ChunkResult, Journal, read_chunk_arrays, rejects_bytes, work_dir_for
from packtool.stages.tokenize.output import check_output, guarded_output
from packtool.stages.tokenize.settings import ChunkSettings, special_policy
from packtool.stages.tokenize.shards import shard_build, shard_entry, shard_slice
from packtool.stages.tokenize.sources import Chunk, SourceFile, expand_inputs, plan_chunks
from packtool.stages.tokenize.template import check_chat_template, read_chat_template
from packtool.stages.tokenize.tokenizer import TokenizerInfo, load_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenizeResult:
    """The finished store and how it was made."""

    path: Path
    manifest: dict[str, Any]
    n_chunks: int
    reused_chunks: int
    up_to_date: bool = False


def tokenize_corpus(
    config: TokenizeConfig, progress: Progress | None = None, executor: Executor | None = None
) -> TokenizeResult:
    """Tokenize `config.inputs` into the token store `config.output` (see the module docstring).

    `progress(done_bytes, total_bytes)` is called after each chunk. The whole write phase holds the
    output's lock; a full disk or an unwritable output is one StorageError (see `output.py`).
    """
    config.validate()
    output = Path(config.output).expanduser().resolve()
    tokenizer = load_tokenizer(config.tokenizer)
    paths = expand_inputs(config.inputs)
    with guarded_output(output):
        return _tokenize(config, output, tokenizer, paths, progress, executor)


def _tokenize(
    config: TokenizeConfig,
    output: Path,
    tokenizer: tuple[Tokenizer, TokenizerInfo],
    paths: list[Path],
    progress: Progress | None,
    executor: Executor | None,
) -> TokenizeResult:
    tok, info = tokenizer
    sources, all_chunks = plan_chunks(paths, max(1, int(config.chunk_bytes)))
    chunks = shard_slice(all_chunks, config.num_shards, config.shard_index)  # all of them unless sharded
    settings = _settings(config, info, output)
    choice = choose_backend(
        config.backend,
        tok,
        info.path,
        lambda: input_sample(all_chunks, settings),
        settings.policy.add_special_tokens,
        settings.format != InputFormat.TEXT,
    )
    log.info("tokenizer backend: %s (%s)", choice.name, choice.reason)
    settings = replace(settings, backend=choice.name)
    fingerprint = hashlib.sha256(f"{__version__}|{settings.fingerprint()}".encode()).hexdigest()
    build = hashlib.sha256(json.dumps([fingerprint, [(s.path, s.sha256) for s in sources]]).encode()).hexdigest()
    shard = None
    if config.num_shards > 1:
        shard = shard_entry(build, len(all_chunks), config.num_shards, config.shard_index)
        build = shard_build(build, config.num_shards, config.shard_index)
    existing = check_output(output, build, config.overwrite, paths)
    if existing is not None:
        return TokenizeResult(output, existing, len(chunks), len(chunks), up_to_date=True)

    journal = Journal(work_dir_for(output), fingerprint)
    by_path = {s.path: s for s in sources}
    results: dict[int, ChunkResult] = {}
    tasks: list[ChunkTask] = []
    for chunk in chunks:
        key = _chunk_key(fingerprint, chunk, by_path)
        done = journal.reusable(chunk.index, key)
        if done is not None:
            results[chunk.index] = done
        else:
            tasks.append(ChunkTask(chunk, settings, key))
    reused = len(results)
    total = sum(c.n_bytes for c in chunks)
    done_bytes = sum(r.n_bytes for r in results.values())
    if progress:
        progress(done_bytes, total)
    run = executor or make_executor(
        config.executor,
        config.resolved_workers(),
        processes=True,
        ray_address=config.ray_address,
        worker_env=worker_env,
    )
    try:
        for result in run(tasks):
            journal.record(result)
            results[result.index] = result
            done_bytes += result.n_bytes
            if progress:
                progress(done_bytes, total)
    finally:
        journal.close()
    manifest = _finish(
        output,
        journal,
        chunks,
        results,
        sources,
        settings,
        info,
        config,
        build,
        {"backend": choice.manifest(), **({"shard": shard} if shard else {})},
    )
    journal.remove()
    log.info(
        "tokenized %d documents, %d tokens into %s (%d/%d chunks reused)",
        manifest["n_documents"],
        manifest["n_tokens"],
        output,
        reused,
        len(chunks),
    )
    return TokenizeResult(output, manifest, len(chunks), reused)


def _settings(config: TokenizeConfig, info: TokenizerInfo, output: Path) -> ChunkSettings:
    fmt = InputFormat(config.format)
    template = info.chat_template
    if config.chat_template is not None:
        template = read_chat_template(config.chat_template)
    if fmt == InputFormat.CHAT and template:
        check_chat_template(template, config.chat_template or f"of tokenizer {info.name!r} (tokenizer_config.json)")
    if fmt == InputFormat.CHAT and not template:
        raise ConfigError(
            f"--format chat needs a chat template but tokenizer {info.name!r} has none in tokenizer_config.json, "
            "pass --chat-template FILE"
        )
    return ChunkSettings(
        tokenizer_path=info.path,
        tokenizer_sha256=info.sha256,
        format=fmt.value,
        field=config.field,
        prompt_field=config.prompt_field,
        completion_field=config.completion_field,
        messages_field=config.messages_field,
        chat_template=template if fmt == InputFormat.CHAT else None,
        assistant_turns=str(config.assistant_turns),
        bos_token=info.bos_token,
        eos_token=info.eos_token,
        separator=config.separator,
        on_error=str(config.on_error),
        policy=special_policy(info, fmt, config.bos, config.eos),
        dtype=dtype_name(dtype_for_max_id(info.max_id)),
        work_dir=str(work_dir_for(output)),
        max_record_bytes=config.max_record_bytes,
    )


def _chunk_key(fingerprint: str, chunk: Chunk, by_path: dict[str, SourceFile]) -> str:
    ident = [
        fingerprint,
        chunk.kind,
        chunk.start,
        chunk.end,
        chunk.first_line,
        [(p, by_path[p].sha256) for p in chunk.paths],
    ]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()


def _finish(
    output: Path,
    journal: Journal,
    chunks: list[Chunk],
    results: dict[int, ChunkResult],
    sources: list[SourceFile],
    settings: ChunkSettings,
    info: TokenizerInfo,
    config: TokenizeConfig,
    build: str,
    extra: dict[str, Any],
) -> dict[str, Any]:
    counts = {s.path: [0, 0, 0] for s in sources}
    for result in results.values():
        for path, (records, documents, rejected) in result.sources.items():
            got = counts[path]
            got[0], got[1], got[2] = got[0] + records, got[1] + documents, got[2] + rejected
    if not any(c[1] for c in counts.values()) and config.num_shards == 1:  # a shard may be empty
        records = sum(c[0] for c in counts.values())
        raise InputError(
            f"no documents to tokenize ({len(sources)} input files, {records} records, "
            f"{sum(c[2] for c in counts.values())} rejected)",
            ", ".join(s.path for s in sources[:3]),
            hint="check the inputs and --field / --format",
        )
    for path, (records, _, _) in counts.items():
        if records == 0 and config.num_shards == 1:  # a shard reads only part of the inputs
            log.warning("input %s holds no records", path)
    dtype = dtype_for_max_id(info.max_id)
    with_loss = settings.format != InputFormat.TEXT
    with write_token_store(output, dtype) as writer:
        rejects = open(writer.directory / REJECTS, "wb") if settings.on_error == OnError.SKIP else None  # noqa: SIM115
        for chunk in chunks:
            writer.append(*read_chunk_arrays(journal.work_dir, chunk.index, dtype, with_loss))
            if rejects is not None:
                rejects.write(rejects_bytes(journal.work_dir, chunk.index))
        if rejects is not None:
            rejects.close()
        manifest = {
            "packtool_version": __version__,
            "tokenizer": info.manifest(),
            **settings.policy.manifest,
            "input_format": settings.format,
            "fields": _fields(config),
            "chat_template_sha256": hashlib.sha256(settings.chat_template.encode()).hexdigest()
            if settings.chat_template
            else None,
            "sources": [
                {
                    "path": s.path,
                    "sha256": s.sha256,
                    "records": counts[s.path][0],
                    "documents": counts[s.path][1],
                    "rejected": counts[s.path][2],
                }
                for s in sources
            ],
            "n_rejected": sum(c[2] for c in counts.values()),
            "backend": extra["backend"],
            "build": build,
            **({"shard": extra["shard"]} if "shard" in extra else {}),  # last: merge drops it
        }
        manifest = writer.finish(manifest)
    return manifest


def _fields(config: TokenizeConfig) -> dict[str, Any]:
    fmt = InputFormat(config.format)
    if fmt == InputFormat.TEXT:
        return {"field": config.field, "separator": config.separator}
    if fmt == InputFormat.PROMPT_COMPLETION:
        return {"prompt_field": config.prompt_field, "completion_field": config.completion_field}
    return {"messages_field": config.messages_field}
