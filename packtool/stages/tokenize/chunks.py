"""`tokenize_chunk`: the pure unit of work, one chunk of input -> its token ids, in memory.

It depends only on (chunk, settings), so any executor can run it: inline, a local thread pool
(the default: the Rust tokenizers release the GIL, and one loaded tokenizer serves every
thread), a process pool or a Ray task (the result is pickled back). The coordinator appends
results to the store in chunk order as they come (`pipeline.py`), so nothing is written twice.
Records are batched by characters (~2 MB of text per `encode_batch` call: large enough to
amortise the Rust call and keep all threads busy, small enough to keep memory flat), never by
token.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from packtool.choices import OnError
from packtool.core.encoding.encode import Spans, encode_batch
from packtool.core.encoding.pairs import PairTexts, encode_pairs
from packtool.errors import InputError
from packtool.formats.token_store import parse_dtype
from packtool.stages.tokenize.backend_choice import cached_backend
from packtool.stages.tokenize.engine.tokenizer import cached_tokenizer
from packtool.stages.tokenize.inputs.chunk import Chunk
from packtool.stages.tokenize.inputs.plan import read_chunk
from packtool.stages.tokenize.inputs.readers.base import Numbering
from packtool.stages.tokenize.inputs.readers.registry import reader_named
from packtool.stages.tokenize.journal import ChunkResult
from packtool.stages.tokenize.records import extract
from packtool.stages.tokenize.settings import ChunkSettings
from packtool.stages.tokenize.vision import VisionText, image_rows

BATCH_CHARS = 2_000_000
BATCH_DOCS = 8192
#: at most this many bytes of rendered text held by `prerender` (memory stays flat; a text with an emoji
#: takes 4 bytes a character)
PRERENDER_BYTES = 32 << 20

#: (text, target spans), the same with images, a pair's texts, or why the record is bad
Got = tuple[str, Spans | None] | VisionText | PairTexts | str
_AHEAD: dict[tuple[Chunk, str], list[tuple[str, int | None, Got]]] = {}
_AHEAD_LOCK = threading.Lock()


@dataclass(frozen=True)
class ChunkTask:
    """One chunk to tokenize: picklable, self-contained, idempotent (a `packtool.exec.Task`)."""

    chunk: Chunk
    settings: ChunkSettings
    key: str

    def run(self) -> ChunkResult:
        return tokenize_chunk(self.chunk, self.settings, self.key)


def worker_env(threads: int) -> dict[str, str]:
    """Environment of a chunk worker: its share of cores for the Rust tokenizer's own threads."""
    return {"RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true" if threads > 1 else "false"}


_PARENS = re.compile(r"\s*\([^()]*\)")  # a parenthesised detail, wherever it stands
_NUMBER = re.compile(r"'[^']*'|(?<![\w-])(\d+)\b")  # a number of its own outside quotes (not UTF-8's 8, bing2's 2)


def reason_kind(reason: str) -> str:
    """A reject reason without its particulars, for counting by reason: details in parentheses (anywhere) or
    after a colon dropped, numbers generalised ("turn 3 has unknown role 'bing2' with no mapping (pass ...)" ->
    "turn N has unknown role 'bing2' with no mapping")."""
    kind, n = reason, 1
    while n:  # innermost first, so nested parentheses go too
        kind, n = _PARENS.subn("", kind)
    kind = kind.split(": ", 1)[0]
    return _NUMBER.sub(lambda m: "N" if m.group(1) else m.group(0), kind).strip() or reason[:80]


def chunk_records(chunk: Chunk, settings: ChunkSettings) -> Iterator[tuple[str, int | None, Got]]:
    """(source, line, text and spans or the reason) of every record of `chunk`, in order."""
    settings = settings.for_chunk(chunk)  # its file's shape, when `--format auto` found several
    for record in read_chunk(chunk, separator=settings.separator, max_record_bytes=settings.max_record_bytes):
        yield (
            record.source,
            record.line,
            record.error if record.error is not None else extract(record.value, settings, record.source),
        )


def prerender(chunks: Sequence[Chunk], settings: ChunkSettings, pending: Callable[[], bool]) -> Callable[[], None]:
    """Read and render chunks in order while `pending()` (the coordinator waits for the fast engine to load,
    a core's worth of idle time: the chat template's rendering is the Python-bound part of a chat run).

    Each chunk's results wait for its task in this process (`tokenize_chunk` takes them: the same records,
    so the same bytes); at most PRERENDER_BYTES of text are held. Any error stops it quietly: the
    chunk's task meets the same error itself and reports it. Returns the function that drops what no
    task took (a resumed chunk, another executor's run).
    """
    taken: list[tuple[Chunk, str]] = []
    fingerprint = settings.fingerprint()
    held = 0
    for chunk in chunks:
        if not pending() or held >= PRERENDER_BYTES:
            break
        try:
            records = list(chunk_records(chunk, settings))
        except Exception:  # the task reports it, with its own context
            break
        held += sum(_held(got) for _, _, got in records if not isinstance(got, str))
        with _AHEAD_LOCK:
            _AHEAD[(chunk, fingerprint)] = records
        taken.append((chunk, fingerprint))

    def drop() -> None:
        with _AHEAD_LOCK:
            for key in taken:
                _AHEAD.pop(key, None)

    return drop


def _held(got: tuple[str, Spans | None] | VisionText | PairTexts) -> int:
    """Bytes of rendered text (and images) a prerendered record holds."""
    if isinstance(got, PairTexts):
        return sum(sys.getsizeof(text) for text in got)
    if isinstance(got, VisionText):
        return sys.getsizeof(got.text) + sum(len(data) for data in got.images)
    return sys.getsizeof(got[0])


def _take(chunk: Chunk, settings: ChunkSettings) -> list[tuple[str, int | None, Got]] | None:
    with _AHEAD_LOCK:
        if not _AHEAD:
            return None
        return _AHEAD.pop((chunk, settings.fingerprint()), None)


def tokenize_chunk(chunk: Chunk, settings: ChunkSettings, key: str) -> ChunkResult:
    """Tokenize every record of `chunk`; raise InputError on a bad record in fail mode."""
    with_loss = settings.for_chunk(chunk).loss
    ones = settings.loss and not with_loss  # a text file in a store with tokens.loss: every token a target
    tok = cached_tokenizer(settings.tokenizer_path, settings.tokenizer_sha256) if settings.backend != "fast" else None
    backend = cached_backend(settings.backend, settings.tokenizer_path, settings.tokenizer_sha256, tok)
    dtype = parse_dtype(settings.dtype, "chunk settings")
    result = ChunkResult(chunk.index, key, n_bytes=chunk.n_bytes)
    texts: list[str] = []
    spans: list[Spans | None] = []
    visions: list[VisionText | None] = []  # per text: its images (None: a text-only document)
    pairs: list[PairTexts] = []  # a preference shape's records: two documents each (chosen, rejected)
    rejects: list[bytes] = []
    chars = 0

    def flush() -> None:
        nonlocal chars
        if pairs:
            pair_ids, pair_lengths, targets = encode_pairs(backend, pairs, settings.policy.add_special_tokens, dtype)
            result.parts.append((pair_ids, pair_lengths, targets))
            result.n_documents += int(pair_lengths.size)
            result.n_tokens += int(pair_ids.size)
            pairs.clear()
            chars = 0
        if texts:
            ids, lengths, loss = encode_batch(tok, texts, spans if with_loss else None, settings.policy, dtype, backend)
            if ones:
                loss = np.ones(ids.size, np.uint8)
            if settings.vision is not None and any(v is not None for v in visions):
                result.media += image_rows(settings.vision, ids, lengths, loss, visions, result.n_documents)
            result.parts.append((ids, lengths, loss))
            result.n_documents += int(lengths.size)
            result.n_tokens += int(ids.size)
            texts.clear()
            spans.clear()
            visions.clear()
            chars = 0

    for path in chunk.paths:
        result.sources[path] = [0, 0, 0]
    reader = reader_named(chunk.kind)
    indexed = reader.numbering is Numbering.INDEX  # a .json array: records are addressed by their 0-based index
    for source, line_no, got in _take(chunk, settings) or chunk_records(chunk, settings):
        counts = result.sources[source]
        counts[0] += 1
        if isinstance(got, str):
            if settings.on_error == OnError.FAIL:
                raise InputError(
                    f"bad record: {got}" + (f" (record {line_no} {reader.record_label}, 0-based)" if indexed else ""),
                    source,
                    line_no,
                    hint=(
                        "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                        if got == "invalid UTF-8"
                        else "fix the record"
                    )
                    + ", or pass --on-error skip to log it in rejects.jsonl and go on",
                )
            line = {"source": source, "line": line_no, "reason": got}  # SPEC's keys for every input
            if indexed:  # e.g. a .json array: `line` is the element's 0-based index, as in its `file:N` errors
                line["record"] = line_no
            rejects.append((json.dumps(line, ensure_ascii=False) + "\n").encode())
            counts[2] += 1
            kind = reason_kind(got)
            result.reasons[kind] = result.reasons.get(kind, 0) + 1
            continue
        if isinstance(got, PairTexts):  # one record, two documents (chosen, rejected): both or none
            counts[1] += 2
            pairs.append(got)
            chars += len(got.prompt) + len(got.chosen) + len(got.rejected)
            if chars >= BATCH_CHARS or len(pairs) * 3 >= BATCH_DOCS:
                flush()
            continue
        counts[1] += 1
        texts.append(got[0])
        spans.append(got[1])
        visions.append(got if isinstance(got, VisionText) else None)
        chars += len(got[0])
        if chars >= BATCH_CHARS or len(texts) >= BATCH_DOCS:
            flush()
    flush()
    result.rejects = b"".join(rejects)
    return result
