"""`--backend auto|hf|fast`: which tokenizer engine a run uses, and one engine object per process.

`auto` (the default) uses `fast` only when it is installed, loads the tokenizer, and gives ids
identical to `hf` on a verification sample (the first documents of the whole input, so every
shard of a sharded run decides the same way); otherwise it says why and uses `hf`. The output
bytes never depend on the backend. Formats with a loss mask (prompt-completion, chat) need token
offsets: `fast` derives them from the ids for byte-level BPE tokenizers, checking every document's
bytes as it goes (core/encoding/byte_offsets.py), so the sample check is the same as for text: ids.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

import numpy as np
from tokenizers import Tokenizer

from packtool.choices import BackendName
from packtool.core.encoding.backends import FAST_PACKAGE, Backend, FastBackend, HFBackend
from packtool.errors import ConfigError, TokenizerError
from packtool.stages.tokenize.records import extract
from packtool.stages.tokenize.settings import ChunkSettings
from packtool.stages.tokenize.sources import Chunk, read_chunk

log = logging.getLogger(__name__)

#: verification sample for --backend auto: at most this many documents / characters
VERIFY_DOCS = 1000
VERIFY_CHARS = 1 << 20


def fast_version() -> str | None:
    """The installed fastokens version, or None when it is not installed."""
    try:
        return metadata.version(FAST_PACKAGE)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run uses and why (goes to the log and the manifest)."""

    name: str  # "hf" or "fast"
    reason: str

    def manifest(self) -> dict[str, str | None]:
        version = fast_version() if self.name == BackendName.FAST else metadata.version("tokenizers")
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
            got = record.error if record.error is not None else extract(record.value, settings)
            if isinstance(got, str):
                continue
            out.append(got[0])
            size += len(got[0])
            if len(out) >= VERIFY_DOCS or size >= VERIFY_CHARS:
                return out
    return out


def first_difference(
    reference: Tokenizer, candidate: Backend, texts: Sequence[str], add_special_tokens: bool
) -> str | None:
    """None when `candidate` gives the ids of `reference` on every text, else where it does not."""
    ref_ids, ref_lengths = HFBackend(reference).encode_flat(texts, add_special_tokens)
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


def choose_backend(
    requested: str,
    tokenizer: Tokenizer,
    tokenizer_path: str,
    sample: Callable[[], Sequence[str]],
    add_special_tokens: bool,
    needs_offsets: bool,
) -> BackendChoice:
    """Resolve --backend: `hf`, `fast` (an error when unusable) or `auto` (fast when verified).

    `sample()` gives the verification texts; it is only called when fast is a candidate.
    """
    try:
        requested = BackendName(requested)
    except ValueError as exc:
        raise ConfigError(f"--backend {requested!r} is not one of auto, hf, fast, pick one of them") from exc
    if requested == BackendName.HF:
        return BackendChoice("hf", "requested")
    if requested == BackendName.FAST:
        backend = fast_backend(tokenizer_path, tokenizer)
        if needs_offsets and backend.offsets_reason is not None:
            raise ConfigError(
                f"--backend fast cannot give the token offsets this format's loss mask needs "
                f"({backend.offsets_reason}), use --backend hf or auto"
            )
        diff = first_difference(tokenizer, backend, verification_sample(sample()), add_special_tokens)
        if diff is not None:
            raise TokenizerError(
                f"{FAST_PACKAGE} gives different ids than tokenizers at {diff}, {tokenizer_path}, "
                "use --backend hf (or auto, which falls back by itself)"
            )
        return BackendChoice("fast", "requested, verified identical on the sample")
    if fast_version() is None:
        return BackendChoice("hf", f"{FAST_PACKAGE} is not installed (pip install 'packtool[fast]')")
    try:
        backend = fast_backend(tokenizer_path, tokenizer)
    except TokenizerError as exc:
        return BackendChoice("hf", str(exc))
    if needs_offsets and backend.offsets_reason is not None:
        return BackendChoice("hf", f"{FAST_PACKAGE} gives no offsets for this tokenizer ({backend.offsets_reason})")
    diff = first_difference(tokenizer, backend, verification_sample(sample()), add_special_tokens)
    if diff is not None:
        log.warning("%s gives different ids than tokenizers at %s; using tokenizers", FAST_PACKAGE, diff)
        return BackendChoice("hf", f"{FAST_PACKAGE} differs from tokenizers at {diff}")
    return BackendChoice("fast", "verified identical on the sample")


_CACHE: dict[tuple[str, str, str], Backend] = {}
_FAST: dict[tuple[type, str, int, int], FastBackend] = {}


def fast_backend(tokenizer_path: str, tokenizer: Tokenizer | None = None) -> FastBackend:
    """One FastBackend per process and tokenizer file (the verification and the chunks share it: ~1 s saved)."""
    stat = os.stat(tokenizer_path)
    key = (FastBackend, str(tokenizer_path), stat.st_mtime_ns, stat.st_size)
    if key not in _FAST:
        _FAST[key] = FastBackend(tokenizer_path, tokenizer)
    return _FAST[key]


def cached_backend(name: str, tokenizer_path: str, sha256: str, tokenizer: Tokenizer | None = None) -> Backend:
    """One backend object per worker process and tokenizer (loading takes ~100 ms for 150k vocabularies)."""
    key = (name, tokenizer_path, sha256)
    if key not in _CACHE:
        if name == BackendName.FAST:
            _CACHE[key] = fast_backend(tokenizer_path, tokenizer)
        else:
            _CACHE[key] = HFBackend(tokenizer if tokenizer is not None else Tokenizer.from_file(tokenizer_path))
    return _CACHE[key]
