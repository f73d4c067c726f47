"""What each row of `packtool stats` means: what a batching strategy keeps and what it gives up.

The waste column alone misleads: length-sorted batches of B waste a few percent, close to packing, but
only because a global sort fixes every batch by length, which no trainer wants (batches ordered short to
long, no randomness left). Each strategy's note says that next to its number; `--json` carries the same
notes as data (`strategies`, `notes`), and the text output and the plot are drawn from them.
"""

from __future__ import annotations

from typing import TypedDict


class Note(TypedDict):
    keeps: str
    gives_up: str
    short: str  # the table's column: "keeps / gives up" in a few words


WASTE_NOTE = "padding / computed positions (0% = every computed position is a real token)"
ROWS_NOTE = (
    "sequences computed: rows of N for naive padding, the packers and the lower bound; for the batched "
    "strategies one row per document, padded to its batch's longest (shorter than N: not comparable)"
)
SORT_NOTE = (
    "sorted batches come close to packing (or pass it, when the last pack is mostly empty) only because a "
    "global length sort fixes every batch: no randomness left; packs keep a random order, and cu_seqlens keeps "
    "the documents of a pack apart"
)
SIZE_DEFAULT_NOTE = (
    "the default, no --size given (a token store does not record the size it will be packed at): pass --size N "
    "with your pack size"
)
SIZE_GIVEN_NOTE = "from --size"

_PACKER_KEEPS = (
    "randomness (packs come in a seeded random order) and every token; the documents of a pack are kept apart "
    "by cu_seqlens (positions restart, attention stays inside each document)"
)
_PACKER_GIVES_UP = "padded-batch simplicity: the model reads cu_seqlens (varlen attention) or restarting position ids"
_ALGORITHM_NOTES: dict[str, str] = {
    "ffd": "first fit decreasing: longest first, each into the first pack it fits",
    "bfd": "best fit decreasing: longest first, each into the fullest pack it fits",
    "mffd": "modified first fit decreasing (Johnson & Garey; NeMo-RL's MFFD)",
    "ffs": "first fit in a random order: packs mix lengths as the corpus does, a few more packs",
    "concat": "corpus order, a new pack when the next document does not fit: the simple baseline",
}
_BASE: dict[str, Note] = {
    "naive (pad each to N)": {
        "keeps": "any order, one document per row of N, plain attention",
        "gives_up": "nearly all compute to padding: every document is padded to N",
        "short": "any order / pads each doc to N",
    },
    "random batches of B": {
        "keeps": "randomness (batches of B documents in random order), plain attention",
        "gives_up": "the compute spent padding each batch to its longest document",
        "short": "random order / pads to the longest",
    },
    "sorted batches of B": {
        "keeps": "little padding: neighbours in a length sort have similar lengths",
        "gives_up": "all randomness: a global length sort fixes every batch and orders the run short to long "
        "(a bound for padding, not a way to train)",
        "short": "little padding / NO randomness",
    },
    "dynamic (padded)": {
        "keeps": "some randomness: a seeded shuffle sorted only inside windows of 1024 documents, batches of up "
        "to B*N tokens (DynamicBatchSampler(padded=True)), plain attention",
        "gives_up": "the padding to each batch's longest document",
        "short": "some randomness / pads to longest",
    },
    "lower bound": {
        "keeps": "every token in ceil(tokens / N) rows of N: no strategy computes fewer positions",
        "gives_up": "nothing: a bound, not a strategy (the packers reach it or come close)",
        "short": "ceil(tokens / N) rows of N",
    },
}


def strategy_note(name: str) -> Note:
    """The note of a waste row: the padded strategies and the bound by name, `pack ALGO` from the packer note."""
    if name in _BASE:
        return _BASE[name]
    algorithm = name.removeprefix("pack ")
    how = _ALGORITHM_NOTES.get(algorithm, f"the {algorithm} packer")
    return {
        "keeps": f"{_PACKER_KEEPS}; {how}",
        "gives_up": _PACKER_GIVES_UP,
        "short": "random order / needs cu_seqlens",
    }


def strategy_notes(names: list[str]) -> dict[str, Note]:
    return {name: strategy_note(name) for name in names}


def size_note(size: int, given: bool) -> str:
    return (SIZE_GIVEN_NOTE if given else SIZE_DEFAULT_NOTE).format(size=size)


__all__ = ["ROWS_NOTE", "SORT_NOTE", "WASTE_NOTE", "size_note", "strategy_note", "strategy_notes"]
