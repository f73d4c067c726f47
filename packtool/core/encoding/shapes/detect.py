"""`--format auto`: the shape of sampled records (pure; `stages/tokenize/shape.py` reads the samples).

Each record is asked of every shape (`ShapeSpec.detect` with the default field names); of the shapes
it shows, the one of highest rank is the record's own (a record with `messages` and `text` is chat).
The run takes the highest-ranked of the records' own shapes that every record accepts: as its own
shape, or as a shape it does not contradict (`Fit(exact=False)`: an OpenAI file's records without a
`weight` are chat records that OpenAI's shape also reads). Records of no shape do not decide; two
records that accept no common shape are an error naming both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from packtool.core.encoding.shapes.base import Sample, ShapeFields, ShapeSpec
from packtool.core.encoding.shapes.registry import every_shape
from packtool.errors import ConfigError


@dataclass(frozen=True)
class Candidate:
    """A shape a record has, with the fields it was found under when not the defaults."""

    format: str  # the --format that reads it
    name: str
    spec: ShapeSpec = field(compare=False)
    fields: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        """`chat`, or `chat:conversation` when the turns are under another field than the shape's default."""
        return self.name + "".join(f":{value}" for _, value in self.fields)

    def resolved_fields(self) -> ShapeFields:
        return ShapeFields(**{**self.spec.fields, **dict(self.fields)})


@cache
def _shapes() -> tuple[tuple[str, ShapeSpec, ShapeFields], ...]:
    """(format, spec, default fields) of every shape, highest rank first (asked once per process)."""
    ranked = sorted(every_shape(), key=lambda fs: -fs[1].rank)
    return tuple((fmt, spec, spec.default_fields()) for fmt, spec in ranked)


def fits(record: Any, document: bool = False) -> list[tuple[Candidate, bool]]:
    """(shape, exact) of every shape the record has, highest rank first."""
    out = []
    for fmt, spec, defaults in _shapes():
        if document:
            if spec.documents:
                out.append((Candidate(fmt, spec.name, spec), True))
            continue
        fit = spec.detect(record, defaults)
        if fit is not None:
            out.append((Candidate(fmt, spec.name, spec, fit.fields), fit.exact))
    return out


def _own(found: list[tuple[Candidate, bool]]) -> Candidate | None:
    return next((c for c, exact in found if exact), None)


def detect_shape(record: Any) -> str | None:
    """The label of one record's own shape (`chat`, `sharegpt:messages`, ...), or None when it has none."""
    own = _own(fits(record))
    return None if own is None else own.label


def other_format_hint(record: Any, fmt: str) -> str:
    """` (the record is chat: pass --format chat, or --format auto)` when a record that `fmt` cannot read
    has a shape of its own under another format, else nothing: a `missing field 'text'` on a chat file says
    which flag was left out."""
    own = _own(fits(record)) if isinstance(record, dict) else None
    if own is None or own.format == fmt:
        return ""
    return f" (the record is {own.label}: pass --format {own.format}, or --format auto)"


Decided = list[tuple[Sample, list[tuple[Candidate, bool]], Candidate]]


def decide(samples: Sequence[Sample]) -> Decided:
    """(sample, the shapes it has, its own) of each sampled record that has a shape."""
    decided = []
    for sample in samples:
        found = fits(sample.record, sample.document)
        own = _own(found)
        if own is not None:
            decided.append((sample, found, own))
    return decided


def choose(samples: Sequence[Sample], decided: Decided | None = None) -> tuple[Candidate, Sample]:
    """The shape of the sampled records and the first record of it (see the module docstring); ConfigError
    when no record shows a shape, or two records accept no common shape. `decided`: `decide(samples)`, when
    known."""
    decided = decide(samples) if decided is None else decided
    if not decided:
        raise ConfigError(_no_shape(samples))
    ranked = sorted(dict.fromkeys(own for _, _, own in decided), key=lambda c: -c.spec.rank)
    for candidate in ranked:
        if all(own == candidate or (candidate, False) in found for _, found, own in decided):
            return candidate, next(s for s, _, own in decided if own == candidate)
    first, _, own = decided[0]
    other, _, theirs = next(d for d in decided if d[2] != own and (own, False) not in d[1])
    raise ConfigError(
        f"--format auto found two record shapes: {own.label} at {first.where} and {theirs.label} at "
        f"{other.where}, pass --format for the shape the inputs should have"
    )


def _no_shape(samples: Sequence[Sample]) -> str:
    where = samples[0].where if samples else "the inputs"
    first = samples[0].record if samples else None
    held = f", the first holds {_fields_of(first)}" if isinstance(first, dict) else ""
    clues = list(dict.fromkeys(clue for _, spec in every_shape() for clue in spec.clues))
    expected = ", ".join(clues[:-1]) + f", or {clues[-1]}" if len(clues) > 1 else clues[0]
    return (
        f"--format auto recognises no record shape in the first {len(samples)} records ({where}{held}): "
        f"expected {expected} fields; pass --format and the field flags that name them (see packtool tokenize --help)"
    )


def _fields_of(record: dict[object, object], most: int = 8) -> str:
    """The record's field names, for an error: `fields 'a', 'b', ...` (at most `most` of them)."""
    names = [repr(str(k)) for k in list(record)[:most]]
    more = ", ..." if len(record) > most else ""
    return f"fields {', '.join(names)}{more}" if names else "no fields"
