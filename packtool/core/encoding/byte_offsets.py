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
from tokenizers import Tokenizer

Spans = list[tuple[int, int]]


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


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

    def check(
        self, ids: np.ndarray, lengths: np.ndarray, texts: Sequence[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """Token byte ends `cum` (int64, cum[0] = 0), document bytes, byte lengths, and per document
        whether its tokens do NOT spell its bytes exactly. None when some byte count is off (then
        `_subset` re-checks the others: the global alignment below needs every count right)."""
        try:
            encoded = [t.encode("utf-8") for t in texts]
        except UnicodeEncodeError:  # lone surrogates: `_subset` leaves those documents to tokenizers
            return None
        blens = np.fromiter(map(len, encoded), np.int64, count=len(encoded))
        safe = np.minimum(ids, self.lens.size - 1) if self.lens.size else ids
        tok_lens = np.where(ids < self.lens.size, self.lens[safe], 0)
        cum = np.zeros(ids.size + 1, np.int64)
        np.cumsum(tok_lens, out=cum[1:])
        ends = np.cumsum(lengths)
        starts = ends - lengths
        zeros = np.zeros(ids.size + 1, np.int64)
        np.cumsum(tok_lens == 0, out=zeros[1:])
        bad = (cum[ends] - cum[starts] != blens) | (zeros[ends] > zeros[starts])
        if bad.any():
            return None
        data = np.frombuffer(b"".join(encoded), np.uint8)
        total = int(cum[-1])
        index = np.int32 if total < 2**31 - 1 and self.flat.size < 2**31 - 1 else np.int64
        table = np.repeat((self.starts[safe] - cum[:-1]).astype(index), tok_lens)
        table += np.arange(total, dtype=index)
        wrong = np.flatnonzero(self.flat[table] != data)
        if wrong.size:
            bad[np.searchsorted(np.cumsum(blens), wrong, side="right")] = True
        return cum, data, blens, bad

    def offsets(self, ids: np.ndarray, lengths: np.ndarray, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(int64 [n_tokens, 2] char offsets within each document, bool per document: bytes did not check out)."""
        checked = self.check(ids, lengths, texts)
        if checked is None:
            return self._subset(ids, lengths, texts, None)
        cum, data, _, bad = checked
        char_of_byte = np.cumsum((data & 0xC0) != 0x80) - 1
        char_base = np.zeros(len(texts), np.int64)
        np.cumsum(np.fromiter(map(len, texts), np.int64, count=len(texts))[:-1], out=char_base[1:])
        base = np.repeat(char_base, lengths)
        out = np.empty((ids.size, 2), np.int64)
        if ids.size:
            out[:, 0] = char_of_byte[cum[:-1]] - base
            out[:, 1] = char_of_byte[cum[1:] - 1] + 1 - base
        return out, bad

    def targets(
        self, ids: np.ndarray, lengths: np.ndarray, texts: Sequence[str], spans: Sequence[Spans | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 loss per token: its bytes overlap a target span, bool per document: bytes did not check out).

        Same answer as char offsets + `target_mask` (a token's char range overlaps a char span exactly
        when its byte range overlaps the span's byte range), without building any offsets.
        """
        checked = self.check(ids, lengths, texts)
        if checked is None:
            return self._subset(ids, lengths, texts, spans)
        cum, _, blens, bad = checked
        base = 0
        flat: list[int] = []
        for text, doc_spans, size in zip(texts, spans, blens.tolist(), strict=True):
            if doc_spans:
                ascii_text = text.isascii()
                at = done = 0
                for s, e in doc_spans:
                    if e <= s:
                        continue
                    for p in (s, e):  # char -> byte position, encoding each stretch once
                        at += (p - done) if ascii_text else len(text[done:p].encode("utf-8"))
                        done = p
                        flat.append(base + at)
            base += size
        mask = np.zeros(ids.size, np.uint8)
        if not flat or not ids.size:
            return mask, bad
        span = np.asarray(flat, np.int64).reshape(-1, 2)
        start, end = cum[:-1], cum[1:]
        j = np.searchsorted(span[:, 1], start, side="right")  # first span ending after the token starts
        inside = j < span.shape[0]
        mask[inside] = span[j[inside], 0] < end[inside]
        return mask, bad

    def _subset(
        self, ids: np.ndarray, lengths: np.ndarray, texts: Sequence[str], spans: Sequence[Spans | None] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`offsets` (spans None) or `targets` for the documents whose byte counts match; the others are bad."""
        safe = np.minimum(ids, self.lens.size - 1) if self.lens.size else ids
        tok_lens = np.where(ids < self.lens.size, self.lens[safe], 0)
        ends = np.cumsum(lengths)
        cum = np.zeros(ids.size + 1, np.int64)
        np.cumsum(tok_lens, out=cum[1:])
        sums = cum[ends] - cum[ends - lengths]
        bad = np.fromiter((len(t.encode("utf-8", "surrogatepass")) for t in texts), np.int64, count=len(texts)) != sums
        bad |= np.fromiter((not t.isascii() and _has_surrogate(t) for t in texts), bool, count=len(texts))
        good = np.flatnonzero(~bad)
        keep = np.repeat(~bad, lengths)
        out = np.zeros((ids.size, 2), np.int64) if spans is None else np.zeros(ids.size, np.uint8)
        if good.size:
            sub_texts = [texts[int(i)] for i in good]
            if spans is None:
                sub, sub_bad = self.offsets(ids[keep], lengths[good], sub_texts)
            else:
                sub, sub_bad = self.targets(ids[keep], lengths[good], sub_texts, [spans[int(i)] for i in good])
            out[keep] = sub
            bad[good] = sub_bad
        return out, bad

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
