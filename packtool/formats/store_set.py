"""Several token stores of one tokenizer read as ONE global document and token space.

A mixture's pack store addresses its sources through this space: store s's document d is global
document `doc_offsets[s] + d` and its token t is global token `token_offsets[s] + t`, in the
order the stores were given. For one store the offsets are 0 and the space is the store's own,
so `seg_doc` / `seg_src` of a single-store pack keep their meaning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.errors import FormatError, TokenizerError
from packtool.formats.token_store import MANIFEST, TokenStore, dtype_name, open_token_store


@dataclass(frozen=True)
class StoreSet:
    """Token stores checked to share a tokenizer (sha256) and a token dtype, with their offsets."""

    stores: tuple[TokenStore, ...]
    doc_offsets: np.ndarray  # int64 [n_stores + 1]
    token_offsets: np.ndarray  # int64 [n_stores + 1]

    @classmethod
    def of(cls, store: TokenStore | StoreSet) -> StoreSet:
        """A store set of one token store (or the set itself)."""
        if isinstance(store, StoreSet):
            return store
        return cls((store,), np.array([0, store.n_documents], np.int64), np.array([0, store.n_tokens], np.int64))

    @classmethod
    def ordered(cls, stores: tuple[TokenStore, ...] | list[TokenStore]) -> StoreSet:
        """Stores in the given order with their document and token offsets (no compatibility check)."""
        docs = np.zeros(len(stores) + 1, np.int64)
        toks = np.zeros(len(stores) + 1, np.int64)
        docs[1:] = np.cumsum([s.n_documents for s in stores])
        toks[1:] = np.cumsum([s.n_tokens for s in stores])
        return cls(tuple(stores), docs, toks)

    @property
    def first(self) -> TokenStore:
        return self.stores[0]

    @property
    def dtype(self) -> np.dtype:
        return self.stores[0].dtype

    @property
    def has_loss(self) -> bool:
        """Whether any store has `tokens.loss` (a store without one is all targets)."""
        return any(s.loss is not None for s in self.stores)

    @property
    def n_documents(self) -> int:
        return int(self.doc_offsets[-1])

    @property
    def starts(self) -> np.ndarray:
        """int64 global start offset of every global document."""
        return np.concatenate(
            [s.starts + int(o) for s, o in zip(self.stores, self.token_offsets, strict=False)]
            or [np.zeros(0, np.int64)]
        )

    @property
    def lengths(self) -> np.ndarray:
        return np.concatenate([s.lengths for s in self.stores] or [np.zeros(0, np.int64)])

    def store_of_tokens(self, positions: np.ndarray) -> np.ndarray:
        """Index of the store holding each global token position."""
        return np.searchsorted(self.token_offsets, positions, side="right") - 1

    def store_of_docs(self, docs: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.doc_offsets, docs, side="right") - 1

    def gather(self, positions: np.ndarray, what: str = "tokens") -> np.ndarray:
        """Token ids (`what="tokens"`) or loss bits (`"loss"`; 1 for a store without tokens.loss) at global positions."""
        positions = np.asarray(positions, np.int64)
        if len(self.stores) == 1:
            arr = self.stores[0].tokens if what == "tokens" else self.stores[0].loss
            return np.ones(positions.size, np.uint8) if arr is None else np.asarray(arr[positions])
        out = np.empty(positions.size, self.dtype if what == "tokens" else np.uint8)
        which = self.store_of_tokens(positions)
        for s, store in enumerate(self.stores):
            sel = which == s
            if not sel.any():
                continue
            arr = store.tokens if what == "tokens" else store.loss
            out[sel] = 1 if arr is None else arr[positions[sel] - int(self.token_offsets[s])]
        return out


def open_store_set(paths: list[str | os.PathLike[str]] | tuple[Path, ...], *, check_hashes: bool = False) -> StoreSet:
    """Open every store and check they can be mixed: one tokenizer (sha256 of tokenizer.json), one dtype."""
    opened: dict[Path, TokenStore] = {}  # a store named twice (A:1 A:0.5) is opened and hashed once
    for p in paths:
        key = Path(p).resolve()
        if key not in opened:
            opened[key] = open_token_store(p, check_hashes=check_hashes)
    stores = tuple(opened[Path(p).resolve()] for p in paths)
    if not stores:
        raise FormatError("no token store given, pass at least one STORE")
    first = stores[0]
    tok0 = first.manifest.get("tokenizer", {})
    for store in stores[1:]:
        tok = store.manifest.get("tokenizer", {})
        if tok.get("sha256") != tok0.get("sha256"):
            raise TokenizerError(
                f"token stores of different tokenizers cannot be mixed: {first.path} has "
                f"{tok0.get('name')!r} (tokenizer.json sha256 {str(tok0.get('sha256'))[:12]}...), {store.path} has "
                f"{tok.get('name')!r} ({str(tok.get('sha256'))[:12]}...), {store.path / MANIFEST}, "
                "re-tokenize every source with the same --tokenizer"
            )
        if store.dtype != first.dtype:
            raise FormatError(
                f"token stores of different dtypes cannot be mixed: {first.path} is {dtype_name(first.dtype)}, "
                f"{store.path} is {dtype_name(store.dtype)}, {store.path / MANIFEST}, re-tokenize them with one packtool version"
            )
    return StoreSet.ordered(stores)
