"""Tokenizer engines behind one narrow interface: `encode_flat` (ids) and `encode_offsets` (ids + char offsets).

`hf` is the Hugging Face `tokenizers` library, the reference for every id packtool writes.
`fast` is `fastokens` (Rust, optional extra `packtool[fast]`), the only one of six evaluated
engines that gave ids identical to `tokenizers` on every test corpus (docs/SCALE.md). It returns
one flat uint32 buffer, so no per-token Python objects are built at all. Which engine a run
uses is the tokenize stage's decision (`packtool.stages.tokenize.backend_choice`).

fastokens gives no offsets, so for loss masks (prompt-completion, chat) `FastBackend` derives them
from the ids (`byte_offsets.py`): for a byte-level BPE every token is a known byte string, and when
a document's tokens concatenate to exactly its UTF-8 bytes (checked per document, vectorised) their
byte ranges, mapped to characters, are the offsets `tokenizers` reports. A document that fails the
check (a normalizer changed its text, say) is re-encoded by `tokenizers`; a tokenizer that is not
byte-level gets `tokenizers` offsets for every document.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from tokenizers import Tokenizer

from packtool.errors import ConfigError, TokenizerError

if TYPE_CHECKING:  # byte_offsets is imported only when offsets are needed
    from concurrent.futures import Future

    from packtool.core.encoding.byte_offsets import ByteTables, Spans

FAST_PACKAGE = "fastokens"
#: the version whose ids were verified identical to `tokenizers` (docs/SCALE.md)
FAST_VERIFIED_VERSION = "0.3.5"


class Backend(Protocol):
    """What the pipeline needs from a tokenizer engine."""

    name: str

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        """Encode documents: (all ids concatenated as uint32, int64 token count per document)."""
        ...

    def encode_offsets(
        self, texts: Sequence[str], add_special_tokens: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, lengths, int64 [n_tokens, 2] character offsets within each document, as `tokenizers` gives)."""
        ...

    def encode_targets(
        self, texts: Sequence[str], spans: Sequence[Spans | None], add_special_tokens: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, lengths, uint8 loss: 1 where a token's character range overlaps a target span of its document)."""
        ...


class HFBackend:
    """`tokenizers.Tokenizer.encode_batch_fast` (no offsets), flattened at C level."""

    name = "hf"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        encodings = self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
        lengths = np.fromiter((len(e) for e in encodings), np.int64, count=len(encodings))
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.uint32, count=int(lengths.sum()))
        return ids, lengths

    def encode_offsets(
        self, texts: Sequence[str], add_special_tokens: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        lengths = np.fromiter((len(e) for e in encodings), np.int64, count=len(encodings))
        total = int(lengths.sum())
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.uint32, count=total)
        offsets = np.fromiter(
            chain.from_iterable(chain.from_iterable(e.offsets for e in encodings)), np.int64, count=2 * total
        )
        return ids, lengths, offsets.reshape(-1, 2)

    def encode_targets(
        self, texts: Sequence[str], spans: Sequence[Spans | None], add_special_tokens: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids, lengths, offsets = self.encode_offsets(texts, add_special_tokens)
        return ids, lengths, target_mask(offsets, lengths, [len(t) for t in texts], spans)


def target_mask(
    offsets: np.ndarray, lengths: np.ndarray, text_lengths: Sequence[int], spans: Sequence[Spans | None]
) -> np.ndarray:
    """1 where a token's [start, end) character range overlaps a target span of its document."""
    base = np.zeros(len(text_lengths), np.int64)
    np.cumsum(np.asarray(text_lengths, np.int64)[:-1] + 1, out=base[1:])
    flat = [(b + s, b + e) for b, doc in zip(base.tolist(), spans, strict=True) for s, e in (doc or ()) if e > s]
    mask = np.zeros(offsets.shape[0], np.uint8)
    if not flat or not offsets.size:
        return mask
    span = np.asarray(flat, np.int64)
    shift = np.repeat(base, lengths)
    start, end = offsets[:, 0] + shift, offsets[:, 1] + shift
    j = np.searchsorted(span[:, 1], start, side="right")  # first span ending after the token starts
    inside = j < span.shape[0]
    mask[inside] = (span[j[inside], 0] < end[inside]) & (end[inside] > start[inside])
    return mask


class FastBackend:
    """`fastokens.Tokenizer.encode_batch_flat`: two byte buffers, parallel in Rust."""

    name = "fast"

    def __init__(
        self, tokenizer_path: str, reference: Tokenizer | None = None, preloaded: Future[Any] | None = None
    ) -> None:
        """`preloaded`: `fastokens.Tokenizer.from_file(tokenizer_path)` already under way (a run starts it first)."""
        try:
            import fastokens
        except ImportError as exc:
            raise ConfigError(
                f"--backend fast needs the {FAST_PACKAGE} package, which is not installed, "
                f"pip install 'packtool[fast]' or use --backend hf"
            ) from exc
        try:
            if preloaded is not None:
                self.tokenizer = preloaded.result()
            else:
                self.tokenizer = fastokens.Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # the Rust side raises ValueError/Exception for unsupported pieces
            raise TokenizerError(
                f"{FAST_PACKAGE} cannot load this tokenizer ({exc}), {tokenizer_path}, "
                "use --backend hf (or auto, which falls back by itself)"
            ) from exc
        self.path = str(tokenizer_path)
        self._reference = None if reference is None else HFBackend(reference)
        self._tables: ByteTables | None = None
        self._lock = threading.Lock()

    def use_reference(self, reference: Tokenizer, tables: ByteTables | None = None) -> None:
        """The `tokenizers` object already loaded by the caller, for offsets (else loaded when first needed),
        and its byte tables when the caller built them already (`ByteTables.build(reference)`)."""
        with self._lock:
            if self._reference is None:
                self._reference = HFBackend(reference)
            if self._tables is None and tables is not None:
                self._tables = tables

    @property
    def reference(self) -> HFBackend:
        """`tokenizers` on the same file: loaded only when offsets are needed (~0.4 s at 150k)."""
        with self._lock:
            if self._reference is None:
                self._reference = HFBackend(Tokenizer.from_file(self.path))
            return self._reference

    @property
    def tables(self) -> ByteTables:
        """The byte tables of the vocabulary, built on first use (~0.4 s at 150k; never for --format text)."""
        reference = self.reference
        from packtool.core.encoding.byte_offsets import ByteTables

        with self._lock:
            if self._tables is None:
                self._tables = ByteTables.build(reference.tokenizer)
            return self._tables

    @property
    def offsets_reason(self) -> str | None:
        """None when offsets come from the ids (byte-level BPE), else why they come from `tokenizers`."""
        return self.tables.reason

    def encode_offsets(
        self, texts: Sequence[str], add_special_tokens: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.tables.reason is not None:
            return self.reference.encode_offsets(texts, add_special_tokens)
        ids, lengths = self.encode_flat(texts, False)
        offsets, bad = self.tables.offsets(ids, lengths, texts)
        if bad.any():
            ids, lengths, offsets = self._redo(texts, ids, lengths, offsets, np.flatnonzero(bad))
        if add_special_tokens:
            ids, lengths, offsets = self.tables.add_specials(ids, lengths, offsets)
        return ids, lengths, offsets

    def encode_targets(
        self, texts: Sequence[str], spans: Sequence[Spans | None], add_special_tokens: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.tables.reason is not None:
            return self.reference.encode_targets(texts, spans, add_special_tokens)
        ids, lengths = self.encode_flat(texts, False)
        loss, bad = self.tables.targets(ids, lengths, texts, spans)
        if bad.any():
            redo = np.flatnonzero(bad)
            picks = redo.tolist()
            ref = self.reference.encode_targets([texts[i] for i in picks], [spans[i] for i in picks], False)
            ids, lengths, loss = _splice((ids, lengths, loss), ref, redo)
        if add_special_tokens:
            ids, lengths, loss = self.tables.add_specials(ids, lengths, loss)
        return ids, lengths, loss

    def _redo(
        self, texts: Sequence[str], ids: np.ndarray, lengths: np.ndarray, offsets: np.ndarray, bad: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Replace the documents whose bytes did not check out with `tokenizers`' own encoding (rare)."""
        ref = self.reference.encode_offsets([texts[i] for i in bad], False)
        return _splice((ids, lengths, offsets), ref, bad)

    def encode_flat(self, texts: Sequence[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        raw_ids, raw_offsets = self.tokenizer.encode_batch_flat(list(texts), add_special_tokens=add_special_tokens)
        ids = np.frombuffer(raw_ids, np.dtype("<u4"))
        offsets = np.frombuffer(raw_offsets, np.dtype("<u8")).astype(np.int64)
        return ids, np.diff(offsets)


def _splice(
    ours: tuple[np.ndarray, np.ndarray, np.ndarray], ref: tuple[np.ndarray, np.ndarray, np.ndarray], redo: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`ours` (ids, lengths, per-token values) with the documents `redo` replaced by `ref`'s (rare path)."""
    ids, lengths, values = ours
    ref_ids, ref_lengths, ref_values = ref
    ends, ref_ends = np.cumsum(lengths), np.cumsum(ref_lengths)
    fixed = dict(zip(redo.tolist(), range(redo.size), strict=True))
    id_parts, value_parts = [], []
    for i in range(lengths.size):  # per document, only when some document needed it
        j = fixed.get(i)
        if j is None:
            id_parts.append(ids[ends[i] - lengths[i] : ends[i]])
            value_parts.append(values[ends[i] - lengths[i] : ends[i]])
        else:
            id_parts.append(ref_ids[ref_ends[j] - ref_lengths[j] : ref_ends[j]])
            value_parts.append(ref_values[ref_ends[j] - ref_lengths[j] : ref_ends[j]])
    new_lengths = lengths.copy()
    new_lengths[redo] = ref_lengths
    return np.concatenate(id_parts), new_lengths, np.concatenate(value_parts)
