"""Character offsets of byte-level BPE tokens, derived from the ids alone (fastokens gives none).

A byte-level BPE (GPT-2, Llama 3, Qwen, DeepSeek, Mistral Tekken, gpt-oss ...) maps every vocabulary
entry to a fixed byte string (its characters through the GPT-2 byte alphabet; an added token is its
own UTF-8 content). When a document's tokens concatenate to exactly the document's UTF-8 bytes, token
k covers bytes [b_k, b_k + len_k), and `tokenizers` reports it as the characters holding those bytes:
[char(b_k), char(b_k + len_k - 1) + 1). Both the check and the mapping are a few numpy passes over
the batch's bytes (~1 ns per byte), so offsets cost far less than the encode itself. A document
whose bytes do not check out (a normalizer rewrote its text, an added token stripped spaces) is
reported as bad and re-encoded by `tokenizers` (backends.FastBackend).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit
from tokenizers import Tokenizer

Spans = list[tuple[int, int]]


@njit(cache=True, nogil=True)
def _spell(
    ids: np.ndarray,
    lens: np.ndarray,
    starts: np.ndarray,
    flat: np.ndarray,
    data: np.ndarray,
    token_ends: np.ndarray,
    byte_ends: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    bad: np.ndarray,
) -> None:
    """Walk each document's tokens over its bytes: token byte ranges, and whether they spell it exactly."""
    t = 0
    pos = 0
    for d in range(token_ends.shape[0]):
        limit = byte_ends[d]
        while t < token_ends[d]:
            i = ids[t]
            n = lens[i] if i < lens.shape[0] else 0
            start[t] = pos
            end[t] = pos + n
            if n == 0 or pos + n > limit:
                bad[d] = True
            elif not bad[d]:
                src = starts[i]
                for k in range(n):
                    if flat[src + k] != data[pos + k]:
                        bad[d] = True
                        break
            pos += n
            t += 1
        if pos != limit:
            bad[d] = True
        pos = limit


@njit(cache=True, nogil=True)
def _char_to_byte(
    data: np.ndarray, byte_starts: np.ndarray, docs: np.ndarray, chars: np.ndarray, out: np.ndarray
) -> None:
    """Byte position of each (document, character) query; queries ascend within a document."""
    q = 0
    while q < docs.shape[0]:
        d = docs[q]
        b = byte_starts[d]
        c = 0
        while q < docs.shape[0] and docs[q] == d:
            while c < chars[q]:
                b += 1
                while b < data.shape[0] and (data[b] & 0xC0) == 0x80:
                    b += 1
                c += 1
            out[q] = b
            q += 1


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

    @classmethod
    def build(cls, tok: Tokenizer) -> ByteTables:
        """~0.2 s for a 150k vocabulary (one C-level translate + encode per entry)."""

        def part(component: object) -> object:
            state = getattr(component, "__getstate__", None)
            return json.loads(state()) if component is not None and state is not None else None

        decoders = [t for t, _ in _types(part(tok.decoder))]
        if type(tok.model).__name__ != "BPE" or "ByteLevel" not in decoders:
            return cls.unsupported("the tokenizer is not a byte-level BPE")
        trims = any(node.get("trim_offsets") for _, node in _types(part(tok.post_processor)))
        prefix_space = any(
            n == "ByteLevel" and node.get("add_prefix_space") for n, node in _types(part(tok.pre_tokenizer))
        )
        if trims or prefix_space:
            return cls.unsupported("the tokenizer trims offsets or adds a prefix space")
        alphabet = byte_alphabet()
        added = {i: t.content for i, t in tok.get_added_tokens_decoder().items()}
        vocab = {i: token for token, i in tok.get_vocab(with_added_tokens=False).items() if i not in added}
        size = max([*vocab.keys(), *added.keys(), -1]) + 1
        if not set("".join(vocab.values())) <= alphabet.keys():
            return cls.unsupported("the vocabulary is not byte-level")
        to_latin1 = str.maketrans({c: chr(b) for c, b in alphabet.items()})
        pieces: list[bytes] = [b""] * size
        for i, token in vocab.items():
            pieces[i] = token.translate(to_latin1).encode("latin-1")
        for i, content in added.items():
            pieces[i] = content.encode("utf-8")
        lens = np.fromiter(map(len, pieces), np.int64, count=size)
        starts = np.zeros(size, np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        flat = np.frombuffer(b"".join(pieces), np.uint8)
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
        One compiled pass, ~1 ns a byte."""
        encoded = [t.encode("utf-8", "surrogatepass") for t in texts]  # a lone surrogate never checks out
        byte_ends = np.cumsum(np.fromiter(map(len, encoded), np.int64, count=len(encoded)))
        data = np.frombuffer(b"".join(encoded), np.uint8)
        token_ends = np.cumsum(lengths)
        start = np.empty(ids.size, np.int64)
        end = np.empty(ids.size, np.int64)
        bad = np.zeros(len(texts), np.bool_)
        _spell(ids, self.lens, self.starts, self.flat, data, token_ends, byte_ends, start, end, bad)
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
        byte_starts = np.concatenate(([0], byte_ends[:-1]))
        at = np.empty(len(chars), np.int64)
        _char_to_byte(data, byte_starts, np.asarray(docs, np.int64), np.asarray(chars, np.int64), at)
        span_start, span_end = at[0::2], at[1::2]
        j = np.searchsorted(span_end, start, side="right")  # first span ending after the token starts
        inside = j < span_end.size
        mask[inside] = span_start[j[inside]] < end[inside]
        return mask, bad

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
