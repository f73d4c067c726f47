"""Which record shape a run reads: `--format` as given, or detected from the first records (`auto`).

Detection happens once, in the coordinator, before any chunk runs, so every chunk (and every shard
of a sharded run) reads the same shape. It looks at the first `DETECT_RECORDS` readable records of
the whole input in order: the first one that `core.encoding.shapes.detect_shape` recognises
decides; a later sampled record of another shape is a ConfigError (name the format). Records that
fit no shape do not decide anything: they become per-record errors of the chosen shape. When there
is nothing to decide from, the error says why: the inputs hold no record, or only bad ones (the
first one's file:line and reason, as a run with `--format` would report it).
`--format prompt-completion` is TRL's conversational prompt-completion when the first record's
prompt is a list of messages (as TRL decides on a dataset's first example).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice

from packtool.choices import AssistantTurns, InputFormat
from packtool.core.encoding.shapes import detect_shape
from packtool.errors import ConfigError, InputError
from packtool.stages.tokenize.config import TokenizeConfig
from packtool.stages.tokenize.sources import INDEXED_KINDS, Chunk, get_field, read_chunk
from packtool.stages.tokenize.streams import PlainText

DETECT_RECORDS = 64


@dataclass(frozen=True)
class Shape:
    """The resolved shape of a run."""

    format: InputFormat  # never AUTO
    name: str  # text, prompt-completion, conversational-prompt-completion, chat, sharegpt, alpaca
    messages_field: str
    detected: bool  # chosen by --format auto

    @property
    def conversational(self) -> bool:
        return self.name == "conversational-prompt-completion"


@dataclass
class _Sample:
    """The first readable records (source, line, value), and the first bad one met before them."""

    records: list[tuple[str, int | None, object]] = field(default_factory=list)
    bad: tuple[str, int | None, str, bool] | None = None  # (source, line, reason, indexed) of the first bad record
    n_bad: int = 0


def _first_records(chunks: Sequence[Chunk], config: TokenizeConfig) -> _Sample:
    """The first readable records, at most DETECT_RECORDS (and what was bad among them)."""
    sample = _Sample()
    for chunk in chunks:
        records = read_chunk(chunk, separator=config.separator, max_record_bytes=config.max_record_bytes)
        for record in islice(records, DETECT_RECORDS):
            if record.error is None:
                sample.records.append((record.source, record.line, record.value))
            else:
                sample.n_bad += 1
                if sample.bad is None:
                    sample.bad = (record.source, record.line, record.error, chunk.kind in INDEXED_KINDS)
            if len(sample.records) >= DETECT_RECORDS:
                return sample
    return sample


def resolve_shape(config: TokenizeConfig, chunks: Sequence[Chunk]) -> Shape:
    """The shape this run reads (see the module docstring)."""
    fmt = InputFormat(str(config.format))
    default_messages = "conversations" if fmt == InputFormat.SHAREGPT else "messages"
    messages_field = config.messages_field or default_messages
    if fmt == InputFormat.AUTO:
        shape, where = _detect(config, chunks)
    else:
        shape, where = Shape(fmt, str(fmt), messages_field, False), "--format"
        if fmt == InputFormat.PROMPT_COMPLETION:
            for source, line, value in _first_records(chunks, config).records[:1]:
                prompt, reason = get_field(value, config.prompt_field or "prompt")
                if reason is None and isinstance(prompt, list):
                    return Shape(fmt, "conversational-prompt-completion", messages_field, False)
                where = f"the first record, {source}:{line}"
    if config.assistant_turns == AssistantTurns.LAST and shape.name in ("text", "prompt-completion"):
        found = "detected" if shape.detected else "read"
        raise ConfigError(
            f"--assistant-turns last applies to records with assistant turns, but --format {config.format} {found} "
            f"{shape.name} records ({where}), leave --assistant-turns out"
        )
    return shape


def _detect(config: TokenizeConfig, chunks: Sequence[Chunk]) -> tuple[Shape, str]:
    chosen: tuple[str, str, int | None] | None = None  # (shape, source, line)
    sample = _first_records(chunks, config)
    records = sample.records
    if not records:
        _nothing_to_detect(sample, chunks)
    for source, line, value in records:
        shape = "text" if isinstance(value, PlainText) else detect_shape(value)
        if shape is None:
            continue
        if chosen is None:
            chosen = (shape, source, line)
        elif shape != chosen[0]:
            raise ConfigError(
                f"--format auto found two record shapes: {chosen[0]} at {chosen[1]}:{chosen[2]} and {shape} at "
                f"{source}:{line}, pass --format for the shape the inputs should have"
            )
    if chosen is None:
        where = f"{records[0][0]}:{records[0][1]}" if records else "the inputs"
        first = records[0][2] if records else None
        held = f", the first holds {_fields_of(first)}" if isinstance(first, dict) else ""
        raise ConfigError(
            f"--format auto recognises no record shape in the first {len(records)} records ({where}{held}): "
            "expected text, prompt/completion, messages, conversations, conversation, or instruction/output fields; "
            "pass --format and the field flags that name them (see packtool tokenize --help)"
        )
    name, _, under = chosen[0].partition(":")  # a conversation shape may name the field its turns are under
    fmt = InputFormat.PROMPT_COMPLETION if name.endswith("prompt-completion") else InputFormat(name)
    if config.role_map is not None and fmt not in (InputFormat.CHAT, InputFormat.SHAREGPT):
        raise ConfigError(
            f"--role-map applies to chat and sharegpt records, but --format auto detected {name} "
            f"({chosen[1]}:{chosen[2]}), leave --role-map out"
        )
    messages_field = under or ("conversations" if name == "sharegpt" else "messages")
    return Shape(fmt, name, messages_field, True), f"{chosen[1]}:{chosen[2]}"


def _nothing_to_detect(sample: _Sample, chunks: Sequence[Chunk]) -> None:
    """--format auto read no good record: say whether the inputs are empty or only bad (the first one, where)."""
    if sample.bad is None:
        paths = sorted({p for c in chunks for p in c.paths})
        named = ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else "")
        raise InputError(
            "--format auto found no records to detect the record shape from (the inputs are empty)",
            named or "the inputs",
            hint="check the inputs, or pass --format",
        )
    source, line, reason, indexed = sample.bad
    index = f" (record {line} of the JSON array, 0-based)" if indexed else ""
    raise InputError(
        f"--format auto found no readable record to detect the record shape from ({sample.n_bad} bad "
        f"record{'s' if sample.n_bad != 1 else ''}, the first: {reason}{index})",
        source,
        line,
        hint="fix the records, or pass --format for the shape they should have",
    )


def _fields_of(record: dict[object, object], most: int = 8) -> str:
    """The record's field names, for an error: `fields 'a', 'b', ...` (at most `most` of them)."""
    names = [repr(str(k)) for k in list(record)[:most]]
    more = ", ..." if len(record) > most else ""
    return f"fields {', '.join(names)}{more}" if names else "no fields"
