"""Character offsets of byte-level BPE tokens, derived from the ids alone (fastokens gives none).

A byte-level BPE (GPT-2, Llama 3, Qwen, DeepSeek, Mistral Tekken, gpt-oss ...) maps every vocabulary
entry to a fixed byte string (its characters through the GPT-2 byte alphabet; an added token is its
own UTF-8 content). When a document's tokens concatenate to exactly the document's UTF-8 bytes, token
k covers bytes [b_k, b_k + len_k), and `tokenizers` reports it as the characters holding those bytes:
[char(b_k), char(b_k + len_k - 1) + 1). Both the check and the mapping are a few numpy passes over
the batch's bytes (a few ns per byte), so offsets cost far less than the encode itself; numpy only
(numba's import and its cached kernels cost ~0.5 s of GIL-held start-up in every run). A document
whose bytes do not check out (a normalizer rewrote its text, an added token stripped spaces) is
reported as bad and re-encoded by `tokenizers` (backends.FastBackend).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

Spans = list[tuple[int, int]]


def _spell(
    ids: np.ndarray,
    lens: np.ndarray,
    starts: np.ndarray,
    flat: np.ndarray,
    data: np.ndarray,
    token_ends: np.ndarray,
    byte_ends: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lay each document's tokens over its bytes: (token byte starts, ends, per document whether they
    do NOT spell its bytes exactly). Vectorised numpy, a few passes over the batch's bytes.

    Token k of a document starts where the previous one ended (the first at the document's first
    byte), whatever the document's check says; a document is bad when a token has no bytes (an id
    outside the vocabulary), when its tokens' byte lengths do not add up to its own, or when a byte
    differs. The byte comparison gathers every good document's token bytes from `flat` in one pass.
    Positions are int32 when the batch and the vocabulary's bytes allow it (always, in practice).

    Every pass of the usual case (no document bad by its lengths) releases the GIL, so a chunk thread
    checking bytes never waits on one rendering templates: `np.repeat` holds the GIL (and a byte-sized
    one took 0.1 s per 2 M tokens), so the usual case builds its runs by a scatter and a cumulative sum
    (`_runs`) and keeps `np.repeat` for the rare batch with a bad document.
    """
    pos = np.int32 if data.shape[0] + flat.shape[0] < 2**31 - 1 else np.int64
    counts = np.diff(token_ends, prepend=0)
    token_starts = token_ends - counts
    byte_starts = byte_ends - np.diff(byte_ends, prepend=0)
    # the tables (one entry per vocabulary id) take the positions' type, not the per-token arrays; the ids
    # become indices once (`take` would convert the uint32 ids again for every table)
    lens, starts = lens.astype(pos, copy=False), starts.astype(pos, copy=False)
    index = ids.astype(np.intp, copy=False)
    tl: np.ndarray = lens.take(index, mode="clip")  # byte length of every token (0: not a token)
    if ids.shape[0] and int(ids.max()) >= lens.shape[0]:
        tl[ids >= lens.shape[0]] = 0
    cs = np.zeros(ids.shape[0] + 1, pos)
    np.cumsum(tl, out=cs[1:])
    bad = cs[token_ends] - cs[token_starts] != byte_ends - byte_starts
    zero = tl == 0
    if zero.any():
        empty = np.zeros(ids.shape[0] + 1, np.int64)
        np.cumsum(zero, out=empty[1:])
        bad |= empty[token_ends] > empty[token_starts]
    if not bad.any():  # every document's tokens tile its bytes, so the batch's tokens tile the batch's bytes
        start = cs[:-1]
        end = cs[1:]
        if ids.shape[0] == 0:
            return start, end, bad
        # byte k of the batch is byte (k - start) of its token: flat[starts[id] + k - start]
        source = _runs(starts.take(index) - start, start, data.shape[0])
        gathered = flat.take(source)
        if np.array_equal(gathered, data):
            return start, end, bad
        differ = np.flatnonzero(gathered != data)
        bad[np.searchsorted(byte_ends, differ, side="right")] = True
        return start, end, bad
    start = cs[:-1] + np.repeat((byte_starts - cs[token_starts]).astype(pos), counts)
    end = start + tl
    if token_ends.shape[0] == 0 or ids.shape[0] == 0:
        return start, end, bad
    good_tokens = np.repeat(~bad, counts)
    sel_ids = index[good_tokens]
    sel_start = start[good_tokens]
    sel_len: np.ndarray = tl[good_tokens]
    source = np.repeat(starts.take(sel_ids) - sel_start, sel_len)
    where = np.flatnonzero(np.repeat(~bad, byte_ends - byte_starts))  # the good documents' bytes, in order
    source += where.astype(pos)
    differ = np.flatnonzero(flat.take(source) != data[where])
    if differ.size:
        bad[np.searchsorted(byte_ends, where[differ], side="right")] = True
    return start, end, bad


def _runs(values: np.ndarray, at: np.ndarray, n: int) -> np.ndarray:
    """`values[t] + k` for every k in [at[t], at[t + 1]) (the last run ends at n): `np.repeat(values - at,
    np.diff(at, append=n)) + np.arange(n)` without `np.repeat`. `at` starts at 0 and strictly increases
    (tokens of at least one byte tiling [0, n)), so each run begins at its own position: one scatter of
    the steps between runs over ones, then a cumulative sum in place (each prefix is a value of the
    result, so the positions' type never overflows)."""
    step = np.ones(n, values.dtype)
    step[at[1:]] = values[1:] - values[:-1] + 1
    step[0] = values[0]
    return np.cumsum(step, out=step)


def _char_to_byte(
    data: np.ndarray, byte_ends: np.ndarray, text_ends: np.ndarray, docs: np.ndarray, chars: np.ndarray
) -> np.ndarray:
    """Byte position of each (document, character) query: a character's first byte is the one that
    is not a UTF-8 continuation byte, so the batch's n-th character starts at the n-th such byte
    (a lone surrogate, encoded with surrogatepass, is one lead and two continuation bytes too).
    When the batch is ASCII (as many bytes as characters), a character's position is its byte's."""
    text_starts = text_ends - np.diff(text_ends, prepend=0)
    if text_ends.shape[0] and text_ends[-1] == data.shape[0]:
        return (byte_ends - np.diff(byte_ends, prepend=0))[docs] + chars
    lead = np.flatnonzero((data & 0xC0) != 0x80)
    lead = np.append(lead, data.shape[0])  # the end of the batch: a query at a document's last character + 1
    return lead[text_starts[docs] + chars]


def _overlaps(
    start: np.ndarray, end: np.ndarray, span_start: np.ndarray, span_end: np.ndarray, n_bytes: int
) -> np.ndarray:
    """uint8 per token: its byte range [start, end) overlaps one of the (sorted) byte spans.

    Disjoint spans in order (the renderer's) over tokens in byte order (`start` and `end`
    nondecreasing, as `targets` gives them): the tokens a span overlaps are one run, from the first
    token ending after the span starts to the last one starting before it ends (two binary searches
    per span), and the mask is those runs written by one `np.repeat` (a pass over the tokens, not
    over the bytes). Spans that overlap or are out of order: the first span ending after the token's
    start decides. (`n_bytes` is the batch's byte count: every position is below it.)
    """
    n = start.shape[0]
    if span_start.shape[0] and np.all(span_start[1:] >= span_end[:-1]):
        first = np.searchsorted(end, span_start, side="right")  # tokens before it end at or before the span
        last = np.searchsorted(start, span_end, side="left")  # tokens from it on start at or after its end
        np.maximum(first[1:], last[:-1], out=first[1:])  # a token two spans share: the runs must not overlap
        np.maximum(last, first, out=last)  # zero-byte tokens at an empty span's place: an empty run, never negative
        bounds = np.empty(2 * first.shape[0] + 2, np.int64)
        bounds[0], bounds[-1] = 0, n
        bounds[1:-1:2], bounds[2:-1:2] = first, last
        values = np.zeros(bounds.shape[0] - 1, np.uint8)
        values[1::2] = 1
        return values.repeat(np.diff(bounds))  # token-sized, not byte-sized: 0.7 ms per 1 M tokens (np.add.at: 3.4)
    mask = np.zeros(n, np.uint8)
    j = np.searchsorted(span_end, start, side="right")
    inside_j = j < span_end.size
    mask[inside_j] = span_start[j[inside_j]] < end[inside_j]
    return mask


def byte_alphabet() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the character a byte-level vocabulary uses for each byte."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _alphabet_tables() -> tuple[np.ndarray, np.ndarray]:
    """(the byte each character up to U+0143 stands for in a byte-level vocabulary, with every character below 256
    standing for itself; whether a character is in GPT-2's alphabet at all)."""
    byte_of = np.arange(0x144, dtype=np.int64)
    member = np.zeros(0x144, bool)
    for char, byte in byte_alphabet().items():
        byte_of[ord(char)] = byte
        member[ord(char)] = True
    return byte_of, member


_BYTE_OF_CHAR, _IN_ALPHABET = _alphabet_tables()


def _byte_level(pieces: Sequence[str]) -> bool:
    """Whether every character of the vocabulary's strings is one of GPT-2's 256 byte characters."""
    points = np.frombuffer("".join(pieces).encode("utf-32-le"), np.uint32)
    return not points.size or (int(points.max()) < _IN_ALPHABET.size and bool(_IN_ALPHABET[points].all()))


def _types(node: object) -> list[tuple[str, dict[str, object]]]:
    """Every component type in a tokenizer.json subtree (Sequence members included)."""
    if isinstance(node, dict):
        found = [(str(node["type"]), node)] if "type" in node else []
        for value in node.values():
            found += _types(value)
        return found
    if isinstance(node, list):
        return [t for item in node for t in _types(item)]
    return []


@dataclass(frozen=True)
class ByteTables:
    """Byte string of every id, and the ids the post-processor puts around a document."""

    reason: str | None  # why offsets cannot come from ids (None: they can)
    flat: np.ndarray  # all byte strings concatenated (uint8)
    starts: np.ndarray  # int64 start of id i's bytes in `flat`
    lens: np.ndarray  # int64 byte length of id i (0: not a token)
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()

    @classmethod
    def unsupported(cls, reason: str) -> ByteTables:
        empty = np.zeros(0, np.int64)
        return cls(reason, np.zeros(0, np.uint8), empty, empty)

    @staticmethod
    def structural_reason(tok: Tokenizer) -> str | None:
        """Why the tokenizer's pipeline rules offsets from ids out (None: it may allow them), read from its
        components' JSON alone, without the vocabulary (~1 ms): the run decides on it before waiting for the
        fast engine. `build` can still find the vocabulary or the post-processor unfit."""

        def part(component: object) -> object:
            state = getattr(component, "__getstate__", None)
            return json.loads(state()) if component is not None and state is not None else None

        decoders = [t for t, _ in _types(part(tok.decoder))]
        if type(tok.model).__name__ != "BPE" or "ByteLevel" not in decoders:
            return "the tokenizer is not a byte-level BPE"
        trims = any(node.get("trim_offsets") for _, node in _types(part(tok.post_processor)))
        prefix_space = any(
            n == "ByteLevel" and node.get("add_prefix_space") for n, node in _types(part(tok.pre_tokenizer))
        )
        if trims or prefix_space:
            return "the tokenizer trims offsets or adds a prefix space"
        return None

    @classmethod
    def build(cls, tok: Tokenizer) -> ByteTables:
        """~0.05 s for a 100k vocabulary: one `id_to_token` per id, then numpy over the joined strings' code points."""
        reason = cls.structural_reason(tok)
        if reason is not None:
            return cls.unsupported(reason)
        added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
        size = max(tok.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
        # one string per id (no vocabulary dict: `get_vocab` built one in 0.06-0.1 s, holding the GIL)
        tokens = [tok.id_to_token(i) for i in range(size)]
        if None in tokens and any(t is None and i not in added for i, t in enumerate(tokens)):
            # ids with no token below the count: the vocabulary's ids may run past it, so look them all up
            size = max(max(tok.get_vocab(with_added_tokens=False).values(), default=-1), max(added, default=-1)) + 1
            tokens = [tok.id_to_token(i) for i in range(size)]
        pieces = [t or "" for t in tokens]
        for i in added:
            pieces[i] = ""
        if not _byte_level(pieces):
            return cls.unsupported("the vocabulary is not byte-level")
        for i, content in added.items():  # an added token is its own UTF-8 content, one character per byte
            pieces[i] = content.encode("utf-8").decode("latin-1")
        lens = np.fromiter(map(len, pieces), np.int64, count=size)
        starts = np.zeros(size, np.int64)  # (the kernels cast to int32 per batch when positions fit)
        np.cumsum(lens[:-1], out=starts[1:])
        # one character per byte: the alphabet's characters above 255 become the bytes they stand for, and every
        # character below 256 (the alphabet's printable ones, the added tokens' latin-1 text) is its own byte
        points = np.frombuffer("".join(pieces).encode("utf-32-le"), np.uint32)
        flat = _BYTE_OF_CHAR[points].astype(np.uint8)
        with_special = tok.encode("a", add_special_tokens=True).ids
        plain = tok.encode("a", add_special_tokens=False).ids
        for k in range(len(with_special) - len(plain) + 1):
            if with_special[k : k + len(plain)] == plain:
                prefix, suffix = tuple(with_special[:k]), tuple(with_special[k + len(plain) :])
                return cls(None, flat, starts, lens, prefix, suffix)
        return cls.unsupported("the post-processor changes the tokens of a document")

    def spell(
        self, ids: np.ndarray, lengths: np.ndarray, texts: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(byte start and end of every token in the batch's concatenated UTF-8, those bytes, per
        document whether its tokens do NOT spell its bytes exactly, and each document's byte end).
        A few vectorised passes (`_spell`)."""
        encoded = [t.encode("utf-8", "surrogatepass") for t in texts]  # a lone surrogate never checks out
        byte_ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, count=len(encoded)))
        data = np.frombuffer(b"".join(encoded), np.uint8)
        token_ends = np.cumsum(lengths)
        start, end, bad = _spell(ids, self.lens, self.starts, self.flat, data, token_ends, byte_ends)
        return start, end, data, bad, byte_ends

    def offsets(self, ids: np.ndarray, lengths: np.ndarray, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(int64 [n_tokens, 2] char offsets within each document, bool per document: bytes did not check out)."""
        start, end, data, bad, _ = self.spell(ids, lengths, texts)
        char_of_byte = np.cumsum((data & 0xC0) != 0x80) - 1
        char_base = np.zeros(len(texts), np.int64)
        np.cumsum(np.fromiter(map(len, texts), np.int64, count=len(texts))[:-1], out=char_base[1:])
        base = np.repeat(char_base, lengths)
        out = np.zeros((ids.size, 2), np.int64)
        good = np.repeat(~bad, lengths)
        out[good, 0] = char_of_byte[start[good]] - base[good]
        out[good, 1] = char_of_byte[end[good] - 1] + 1 - base[good]
        return out, bad

    def targets(
        self, ids: np.ndarray, lengths: np.ndarray, texts: Sequence[str], spans: Sequence[Spans | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 loss per token: its bytes overlap a target span, bool per document: bytes did not check out).

        Same answer as char offsets + `target_mask` (a token's char range overlaps a char span exactly
        when its byte range overlaps the span's byte range), without building any offsets.
        """
        start, end, data, bad, byte_ends = self.spell(ids, lengths, texts)
        docs: list[int] = []
        chars: list[int] = []
        for d, doc_spans in enumerate(spans):
            for s, e in doc_spans or ():
                if e > s:
                    docs += (d, d)
                    chars += (s, e)
        mask = np.zeros(ids.size, np.uint8)
        if not chars or not ids.size:
            return mask, bad
        text_ends = np.cumsum(np.fromiter(map(len, texts), np.int64, count=len(texts)))
        at = _char_to_byte(data, byte_ends, text_ends, np.asarray(docs, np.int64), np.asarray(chars, np.int64))
        if bad.any():  # a bad document's tokens may run past its bytes: keep every token inside its document's
            # bytes, so tokens stay in byte order for `_overlaps` (a bad document's mask is not used: it is redone)
            low = np.repeat(byte_ends - np.diff(byte_ends, prepend=0), lengths)
            high = np.repeat(byte_ends, lengths)
            start, end = np.clip(start, low, high), np.clip(end, low, high)
        return _overlaps(start, end, at[0::2], at[1::2], data.shape[0]), bad

    def add_specials(
        self, ids: np.ndarray, lengths: np.ndarray, offsets: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Put the post-processor's ids around every document, with (0, 0) offsets (or loss 0) as `tokenizers` does."""
        pre, post = len(self.prefix), len(self.suffix)
        if not (pre or post):
            return ids, lengths, offsets
        n = lengths.size
        new_lengths = lengths + pre + post
        new_ends = np.cumsum(new_lengths)
        new_starts = new_ends - new_lengths
        position = np.arange(ids.size, dtype=np.int64) + np.repeat(
            np.arange(n, dtype=np.int64) * (pre + post) + pre, lengths
        )
        out = np.empty(int(new_ends[-1]) if n else 0, ids.dtype)
        out_offsets = np.zeros((out.size, *offsets.shape[1:]), offsets.dtype)  # offsets (n, 2) or loss (n,)
        out[position] = ids
        out_offsets[position] = offsets
        for k, token in enumerate(self.prefix):
            out[new_starts + k] = token
        for k, token in enumerate(self.suffix):
            out[new_ends - post + k] = token
        return out, new_lengths, out_offsets
