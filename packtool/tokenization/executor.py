"""Executors: the seam between the pipeline and where chunks run.

An executor maps a list of `ChunkTask`s to their `ChunkResult`s, in any order, as they
finish; the pipeline journals each result as it arrives and stitches chunks in index order
afterwards, so the output never depends on the executor. `local_executor` runs chunks in a
spawn-context process pool (one tokenizer per process, no GIL contention for JSON parsing
and id flattening) when there are at least two chunks per worker; with fewer, whole-chunk
processes would leave cores idle at the tail, so it runs the chunks inline and lets the Rust
tokenizer's own threads (`encode_batch_fast` releases the GIL) use the cores. Measured on 2
shared cores, 31 MB of jsonl in 2 chunks: inline threads 0.50 M tok/s vs 2 processes
0.39 M tok/s (scripts/bench_tokenize.py). A Ray executor only has to call `ChunkTask.run` remotely.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from packtool.sources import Chunk
from packtool.tokenization.chunks import tokenize_chunk
from packtool.tokenization.journal import ChunkResult
from packtool.tokenization.settings import ChunkSettings


@dataclass(frozen=True)
class ChunkTask:
    """One chunk to tokenize: picklable, self-contained, idempotent."""

    chunk: Chunk
    settings: ChunkSettings
    key: str

    def run(self) -> ChunkResult:
        return tokenize_chunk(self.chunk, self.settings, self.key)


Executor = Callable[[Sequence[ChunkTask]], Iterator[ChunkResult]]


def _run(task: ChunkTask) -> ChunkResult:
    return task.run()


def _init_worker(threads: int) -> None:
    """Give each process's Rust tokenizer its share of the cores (set before its first batch)."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"


@contextlib.contextmanager
def _parallelism(enabled: bool) -> Iterator[None]:
    """Switch the tokenizers library's batch threads on/off for an inline run, restoring after."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if enabled else "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old


def local_executor(workers: int) -> Executor:
    """Processes over chunks when there are several chunks and workers; inline otherwise."""

    def execute(tasks: Sequence[ChunkTask]) -> Iterator[ChunkResult]:
        if not tasks:
            return
        processes = min(workers, len(tasks))
        if processes <= 1 or len(tasks) < 2 * workers:
            with _parallelism(workers > 1):
                for task in tasks:
                    yield task.run()
            return
        threads = max(1, workers // processes)
        ctx = multiprocessing.get_context("spawn")
        pool = ctx.Pool(processes, initializer=_init_worker, initargs=(threads,))
        try:
            yield from pool.imap_unordered(_run, tasks, chunksize=1)
            pool.close()
        finally:
            pool.terminate()
            pool.join()

    return execute
