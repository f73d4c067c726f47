"""`--backend auto|hf|fast`: which tokenizer engine a run uses, and one engine object per process.

`auto` (the default) uses `fast` only when it is installed, loads the tokenizer, and gives ids
identical to `hf` on a verification sample (the first documents of the whole input, so every
shard of a sharded run decides the same way); otherwise it says why and uses `hf`. The output
bytes never depend on the backend. Formats with a loss mask (prompt-completion, chat) need token
offsets: `fast` derives them from the ids for byte-level BPE tokenizers, checking every document's
bytes as it goes (core/encoding/byte_offsets.py), so the sample check is the same as for text: ids.

Each engine is loaded once per process: the fast one in a background thread while the reference
loads and the inputs are planned, and the verified object is the one every chunk thread uses.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer

from packtool.choices import BackendName
from packtool.core.encoding.backends import FAST_PACKAGE, Backend, FastBackend, HFBackend
from packtool.core.encoding.pairs import PairTexts
from packtool.errors import ConfigError, TokenizerError
from packtool.stages.tokenize.engine.early import load_key, take_fast_load
from packtool.stages.tokenize.inputs.chunk import Chunk
from packtool.stages.tokenize.inputs.plan import read_chunk
from packtool.stages.tokenize.records import extract
from packtool.stages.tokenize.settings import ChunkSettings

if TYPE_CHECKING:
    from packtool.core.encoding.byte_offsets import ByteTables

log = logging.getLogger(__name__)

#: verification sample for --backend auto|fast: at most this many documents / characters. `tokenizers`
#: encodes it while the fast engine loads; 256 KiB costs ~0.2 s of one core with a 131k BPE
#: (docs/BENCHMARKS.md), 1 MiB cost 0.7 s, a third of a bare 128 MB run.
VERIFY_DOCS = 1000
VERIFY_CHARS = 1 << 18
_LOCK = threading.Lock()


def fast_version() -> str | None:
    """The installed fastokens version, or None when it is not installed."""
    return _installed(FAST_PACKAGE)


@functools.cache
def _installed(package: str) -> str | None:
    """A package's installed version, looked up once per process (each lookup scans the
    distributions on sys.path: ~35 ms, and a run asks three times)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run uses and why (goes to the log and the manifest)."""

    name: str  # "hf" or "fast"
    reason: str
    engine: Backend | None = field(default=None, compare=False, repr=False)  # the verified fast engine

    def manifest(self) -> dict[str, str | None]:
        version = fast_version() if self.name == BackendName.FAST else _installed("tokenizers")
        package = FAST_PACKAGE if self.name == BackendName.FAST else "tokenizers"
        return {"name": self.name, "package": f"{package}=={version}"}


def verification_sample(texts: Sequence[str]) -> list[str]:
    """The first documents, up to VERIFY_DOCS documents and VERIFY_CHARS characters."""
    out: list[str] = []
    size = 0
    for text in texts[:VERIFY_DOCS]:
        out.append(text)
        size += len(text)
        if size >= VERIFY_CHARS:
            break
    return out


def input_sample(chunks: Sequence[Chunk], settings: ChunkSettings) -> list[str]:
    """The first good documents of the whole input (not of a shard: every shard must decide alike)."""
    out: list[str] = []
    size = 0
    for chunk in chunks:
        for record in read_chunk(chunk, separator=settings.separator, max_record_bytes=settings.max_record_bytes):
            got = record.error if record.error is not None else extract(record.value, settings, record.source)
            if isinstance(got, str):
                continue
            texts = list(got) if isinstance(got, PairTexts) else [got[0]]  # a pair: all three texts
            out.extend(texts)
            size += sum(map(len, texts))
            if len(out) >= VERIFY_DOCS or size >= VERIFY_CHARS:
                return out
    return out


def first_difference(
    reference: tuple[np.ndarray, np.ndarray], candidate: Backend, texts: Sequence[str], add_special_tokens: bool
) -> str | None:
    """None when `candidate` gives the `reference` (ids, lengths) on every text, else where it does not."""
    ref_ids, ref_lengths = reference
    got_ids, got_lengths = candidate.encode_flat(texts, add_special_tokens)
    if np.array_equal(ref_lengths, got_lengths) and np.array_equal(ref_ids, got_ids):
        return None
    ref_ends, got_ends = np.cumsum(ref_lengths), np.cumsum(got_lengths)
    for i in range(len(texts)):  # per document, not per token: only on the failure path
        a = ref_ids[ref_ends[i] - ref_lengths[i] : ref_ends[i]]
        b = got_ids[got_ends[i] - got_lengths[i] : got_ends[i]]
        if not np.array_equal(a, b):
            return f"document {i} of the verification sample ({len(a)} vs {len(b)} ids)"
    return "the verification sample"


def fast_candidate(requested: str) -> bool:
    """Whether --backend `requested` may end up on the fast engine (so it is worth loading early)."""
    return requested in (BackendName.AUTO, BackendName.FAST) and fast_version() is not None


def _build_tables(tokenizer: Tokenizer) -> Future[ByteTables]:
    """The byte tables of the vocabulary (~0.4 s at 100k, numba's import included) in a background thread."""
    from packtool.core.encoding.byte_offsets import ByteTables

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packtool-tables")
    future = pool.submit(ByteTables.build, tokenizer)
    pool.shutdown(wait=False)
    return future


def preload_fast(tokenizer_path: str) -> Future[FastBackend]:
    """Load the fast engine in a background thread (~1 s for a 150k vocabulary, mostly without the GIL)
    while the caller loads the reference tokenizer and plans the inputs.

    Returns once the thread runs: `tokenizers` holds the GIL while it loads the reference (~0.2 s at
    100k), so a thread that had not started by then would start the load only after it (measured:
    0.2-0.3 s later on the critical path of a chat run).
    """
    with contextlib.suppress(ImportError):  # FastBackend reports it
        import fastokens  # noqa: F401  (imported here, under the GIL, so the thread goes straight to the load)
    started = threading.Event()  # set by the thread just before the GIL-free load begins
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="packtool-load")
    future = pool.submit(fast_backend, tokenizer_path, None, started)
    pool.shutdown(wait=False)
    started.wait(0.1)  # (a cached engine, a failed import or a slow disk never sets it: then go on)
    return future


def choose_backend(
    requested: str,
    tokenizer: Tokenizer,
    tokenizer_path: str,
    sample: Callable[[], Sequence[str]],
    add_special_tokens: bool,
    needs_offsets: bool,
    fast: Future[FastBackend] | None = None,
    meanwhile: Callable[[Callable[[], bool]], None] | None = None,
) -> BackendChoice:
    """Resolve --backend: `hf`, `fast` (an error when unusable) or `auto` (fast when verified).

    `sample()` gives the verification texts; it is only called when fast is a candidate. `fast` is
    the engine already being loaded (`preload_fast`); the reference encodes the sample meanwhile,
    then `meanwhile(pending)` may use the rest of the wait (pending() is true until the engine and
    its byte tables are loaded).
    """
    try:
        requested = BackendName(requested)
    except ValueError as exc:
        raise ConfigError(f"--backend {requested!r} is not one of auto, hf, fast, pick one of them") from exc
    if requested == BackendName.HF:
        return BackendChoice("hf", "requested")
    if requested == BackendName.AUTO and fast_version() is None:
        return BackendChoice("hf", f"{FAST_PACKAGE} is not installed (pip install 'packtool[fast]')")
    if needs_offsets:  # decided from the tokenizer's components before waiting for the engine (3 s for Gemma 3)
        from packtool.core.encoding.byte_offsets import ByteTables

        unfit = ByteTables.structural_reason(tokenizer)
        if unfit is not None:
            return _no_offsets(requested, unfit)
    tables = _build_tables(tokenizer) if needs_offsets else None  # in the background, like the fast engine
    texts = verification_sample(sample())
    reference = HFBackend(tokenizer).encode_flat(texts, add_special_tokens)  # while the fast engine loads
    if meanwhile is not None and fast is not None:
        meanwhile(lambda: not (fast.done() and (tables is None or tables.done())))
    try:
        backend = fast.result() if fast is not None else fast_backend(tokenizer_path)
    except TokenizerError as exc:
        if requested == BackendName.FAST:
            raise
        return BackendChoice("hf", str(exc))
    if hasattr(backend, "use_reference"):  # the reference for offsets: already loaded, never loaded twice
        backend.use_reference(tokenizer, None if tables is None else tables.result())
    if needs_offsets and backend.offsets_reason is not None:
        return _no_offsets(requested, backend.offsets_reason)
    diff = first_difference(reference, backend, texts, add_special_tokens)
    if diff is not None:
        if requested == BackendName.FAST:
            raise TokenizerError(
                f"{FAST_PACKAGE} gives different ids than tokenizers at {diff}, {tokenizer_path}, "
                "use --backend hf (or auto, which falls back by itself)"
            )
        log.warning("%s gives different ids than tokenizers at %s; using tokenizers", FAST_PACKAGE, diff)
        return BackendChoice("hf", f"{FAST_PACKAGE} differs from tokenizers at {diff}")
    if requested == BackendName.FAST:
        return BackendChoice("fast", "requested, verified identical on the sample", backend)
    return BackendChoice("fast", "verified identical on the sample", backend)


def _no_offsets(requested: str, reason: str) -> BackendChoice:
    """The fast engine cannot give this format's offsets: an error for --backend fast, `tokenizers` for auto."""
    if requested == BackendName.FAST:
        raise ConfigError(
            f"--backend fast cannot give the token offsets this format's loss mask needs ({reason}), "
            "use --backend hf or auto"
        )
    return BackendChoice("hf", f"{FAST_PACKAGE} gives no offsets for this tokenizer ({reason})")


_CACHE: dict[tuple[str, str, str], Backend] = {}
_FAST: dict[tuple[type, str, int, int], FastBackend] = {}


def fast_backend(
    tokenizer_path: str, tokenizer: Tokenizer | None = None, started: threading.Event | None = None
) -> FastBackend:
    """One FastBackend per process and tokenizer file (the verification and the chunks share it: ~1 s saved).
    `started` is set just before the load itself begins."""
    file_key = load_key(tokenizer_path)
    key = (FastBackend, *file_key)
    with _LOCK:
        if key not in _FAST:
            if started is not None:  # nothing between here and the load releases the GIL (preload_fast)
                started.set()
            _FAST[key] = FastBackend(tokenizer_path, tokenizer, take_fast_load(file_key))
        return _FAST[key]


def remember_backend(name: str, tokenizer_path: str, sha256: str, engine: Backend) -> None:
    """Make `engine` the one `cached_backend` gives in this process (the verified, already loaded one)."""
    with _LOCK:
        _CACHE[(name, tokenizer_path, sha256)] = engine


def cached_backend(name: str, tokenizer_path: str, sha256: str, tokenizer: Tokenizer | None = None) -> Backend:
    """One engine per process and tokenizer: the one the coordinator remembered, else loaded once here
    (a process or Ray worker). Loading a 150k-vocabulary engine takes ~1 s, so it is never repeated."""
    key = (name, tokenizer_path, sha256)
    with _LOCK:
        found = _CACHE.get(key)
    if found is not None:
        return found
    engine: Backend = (
        fast_backend(tokenizer_path, tokenizer)
        if name == BackendName.FAST
        else HFBackend(tokenizer if tokenizer is not None else Tokenizer.from_file(tokenizer_path))
    )
    with _LOCK:
        return _CACHE.setdefault(key, engine)
