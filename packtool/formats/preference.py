"""A preference token store's manifest key: documents 2i chosen, 2i+1 rejected (`preference.pairs`)."""

from __future__ import annotations

from typing import Any

from packtool.errors import FormatError

#: the manifest key that makes a token store a preference store (documents 2i chosen, 2i+1 rejected)
PREFERENCE = "preference"
PREFERENCE_LAYOUT = "chosen,rejected"


def preference_key(n_documents: int) -> dict[str, Any]:
    """The manifest's `preference` value of a store of `n_documents` (chosen and rejected of each pair)."""
    if n_documents % 2:
        raise FormatError(f"a preference store of {n_documents} documents (an odd count), tokenize, this is a bug")
    return {"pairs": n_documents // 2, "layout": PREFERENCE_LAYOUT}


def preference_pairs(manifest: dict[str, Any], n_documents: int | None = None, where: object = "") -> int | None:
    """The `preference.pairs` count of a token store manifest (None: not a preference store)."""
    pref = manifest.get("preference")
    if pref is None:
        return None
    pairs = pref.get("pairs") if isinstance(pref, dict) else None
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 0:
        raise FormatError(
            f"manifest preference.pairs is {pairs!r}, expected a pair count >= 0, {where}, re-run `packtool tokenize`"
        )
    if n_documents is not None and n_documents != 2 * pairs:
        raise FormatError(
            f"manifest preference.pairs is {pairs} but the store holds {n_documents} documents (expected "
            f"{2 * pairs}: chosen and rejected per pair), {where}, re-run `packtool tokenize`"
        )
    return pairs
