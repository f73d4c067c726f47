"""Which record shape a run reads: `--format` as given, or detected from the first records (`auto`).

Resolution happens once, in the coordinator, before any chunk runs, so every chunk (and every shard
of a sharded run) reads the shape decided for its file. `--format auto` reads the first `DETECT_RECORDS`
readable records of the first input file and `DETECT_MORE_FILES` of each other one
(`core.encoding.shapes.detect.choose` decides; records that fit no shape become per-record errors of the
chosen one). When one shape fits the records of every file, the
run reads that shape (as one file would); otherwise each file is read as its own records decide (a chat
file and a ShareGPT file in one run), `Shape.sources` naming each file's, and every chunk carries its
file's shape (`ChunkSettings.for_chunk`, hashed into the resume keys). Files whose shapes take the
special tokens differently (rendered by a chat template, or plain text with BOS/EOS) cannot share one
store: that is an error naming both. A file with no readable record reads the first file's shape. When
there is nothing to decide from, the error says why: the inputs hold no record, or only bad ones (the first one's file:line and reason, as a run
with `--format` would report it). A format with variants (`prompt-completion`: TRL's conversational
shape when the first record's prompt is a list of messages, as TRL decides on a dataset's first
example) is resolved on the first readable record. Flags the resolved shape does not read are an
error naming the record that decided it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from packtool.choices import AssistantTurns, InputFormat
from packtool.core.encoding.shapes.base import Sample, ShapeFields, ShapeSpec, flag_of
from packtool.core.encoding.shapes.registry import AUTO, every_shape, family
from packtool.errors import ConfigError, InputError, UsageError
from packtool.stages.tokenize.config import TokenizeConfig
from packtool.stages.tokenize.inputs.chunk import Chunk
from packtool.stages.tokenize.inputs.plan import read_chunk
from packtool.stages.tokenize.inputs.readers.base import Numbering
from packtool.stages.tokenize.inputs.readers.registry import reader_named
from packtool.stages.tokenize.inputs.record import PlainText, RawRecord

if TYPE_CHECKING:
    from packtool.core.encoding.shapes.detect import Candidate

DETECT_RECORDS = 64
#: `--format auto` over several files: the records read of each file after the first (a shape shows in a
#: few records; a run of thousands of files decides in about a second)
DETECT_MORE_FILES = 16


@dataclass(frozen=True)
class Shape:
    """The resolved shape of a run."""

    format: InputFormat  # never AUTO
    spec: ShapeSpec
    fields: ShapeFields  # the field names it reads
    detected: bool  # chosen by --format auto
    where: str  # what decided it: `file:line` of a record, or "--format"
    sources: tuple[tuple[str, Shape], ...] = ()  # per input file, when `--format auto` found several shapes

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def loss(self) -> bool:
        """Whether the store has tokens.loss: some shape of the run has tokens that are not targets."""
        return any(shape.spec.loss for shape in self.all())

    def all(self) -> list[Shape]:
        """The run's shape, or each file's when they differ (in input order, one entry per distinct shape)."""
        out: list[Shape] = []
        for _, shape in self.sources:
            if shape not in out:
                out.append(shape)
        return out or [self]

    def manifest_fields(self, config: TokenizeConfig, role_map: tuple[tuple[str, str], ...]) -> dict[str, Any]:
        """The manifest's `fields`: each field the shape reads (by its flag), flags it records, the role map."""
        out: dict[str, Any] = {flag_of(f): getattr(self.fields, f) for f in self.spec.fields}
        out.update((flag, getattr(config, flag)) for flag in self.spec.recorded)
        return {**out, **({"role_map": dict(role_map)} if role_map else {})}


@dataclass
class _Sample:
    """The first readable records, and the first bad one met before them."""

    records: list[Sample] = field(default_factory=list)  # what detect.choose reads
    bad: tuple[str, int | None, str, str] | None = None  # (source, line, reason, index label) of the first bad record
    n_bad: int = 0


def _first_records(chunks: Sequence[Chunk], config: TokenizeConfig) -> _Sample:
    """The first readable records, at most DETECT_RECORDS (and what was bad among them)."""
    sample = _Sample()
    for chunk in chunks:
        records = read_chunk(chunk, separator=config.separator, max_record_bytes=config.max_record_bytes)
        for record in islice(records, DETECT_RECORDS):
            _add(sample, record, chunk)
            if len(sample.records) >= DETECT_RECORDS:
                return sample
    return sample


def _add(sample: _Sample, record: RawRecord, chunk: Chunk) -> None:
    if record.error is None:
        where = f"{record.source}:{record.line}"
        sample.records.append(Sample(where, record.value, isinstance(record.value, PlainText)))
    else:
        sample.n_bad += 1
        if sample.bad is None:
            sample.bad = (record.source, record.line, record.error, _index_label(chunk, record.line))


def _records_by_file(chunks: Sequence[Chunk], config: TokenizeConfig) -> dict[str, _Sample]:
    """The first readable records of each input file (DETECT_RECORDS of the first, DETECT_MORE_FILES of each
    other), in input order; as for one file, at most DETECT_RECORDS records (good or bad) of a chunk are read
    per file it holds, so a file of bad records is not read to its end."""
    by_file: dict[str, _Sample] = {}
    want: dict[str, int] = {}
    for chunk in chunks:
        for path in chunk.paths:
            if path not in by_file:
                by_file[path] = _Sample()
                want[path] = DETECT_RECORDS if len(by_file) == 1 else DETECT_MORE_FILES
        if all(len(by_file[p].records) >= want[p] for p in chunk.paths):
            continue  # a later chunk of a file already sampled
        records = read_chunk(chunk, separator=config.separator, max_record_bytes=config.max_record_bytes)
        for record in islice(records, DETECT_RECORDS * len(chunk.paths)):
            if len(by_file[record.source].records) < want[record.source]:
                _add(by_file[record.source], record, chunk)
            if all(len(by_file[p].records) >= want[p] for p in chunk.paths):
                break
    return by_file


def _index_label(chunk: Chunk, line: int | None) -> str:
    """` (record N of the JSON array, 0-based)` for readers that number records by index, else nothing."""
    reader = reader_named(chunk.kind)
    return f" (record {line} {reader.record_label}, 0-based)" if reader.numbering is Numbering.INDEX else ""


def resolve_shape(config: TokenizeConfig, chunks: Sequence[Chunk]) -> Shape:
    """The shape this run reads (see the module docstring)."""
    fmt = InputFormat(str(config.format))
    shape = _detect(config, chunks) if fmt.value == AUTO else _given(fmt, config, chunks)
    _check_flags(shape, config)
    return shape


def _given(fmt: InputFormat, config: TokenizeConfig, chunks: Sequence[Chunk]) -> Shape:
    base, *variants = family(fmt.value)
    if not variants:
        return Shape(fmt, base, _fields(base, config), False, "--format")
    first = _first_records(chunks, config).records[:1]
    for spec in variants:
        fields = _fields(spec, config)
        if first and spec.detect(first[0].record, fields) is not None:
            return Shape(fmt, spec, fields, False, f"the first record, {first[0].where}")
    return Shape(
        fmt, base, _fields(base, config), False, f"the first record, {first[0].where}" if first else "--format"
    )


def _fields(spec: ShapeSpec, config: TokenizeConfig) -> ShapeFields:
    """The shape's fields: as the flags name them, else the shape's defaults."""
    return ShapeFields(**{f: getattr(config, flag_of(f)) or default for f, default in spec.fields.items()})


def _detect(config: TokenizeConfig, chunks: Sequence[Chunk]) -> Shape:
    from packtool.core.encoding.shapes.detect import choose, decide  # every shape's module: auto runs only

    by_file = _records_by_file(chunks, config)
    sample = _Sample()
    for got in by_file.values():
        sample.records.extend(got.records)
        sample.n_bad += got.n_bad
        sample.bad = sample.bad or got.bad
    if not sample.records:
        _nothing_to_detect(sample, chunks)
    each = {path: decide(got.records) for path, got in by_file.items()}
    try:
        return _detected(*choose(sample.records, [d for got in each.values() for d in got]))
    except ConfigError:
        decided = [path for path, got in by_file.items() if got.records]
        if len(decided) < 2:
            raise  # one file's records: its own error names the two records
    shapes = {path: _detected(*choose(by_file[path].records, each[path])) for path in decided}  # a file that mixes
    first = shapes[decided[0]]
    for shape in shapes.values():
        if shape.spec.pairs != first.spec.pairs:
            pair, single = (first, shape) if first.spec.pairs else (shape, first)
            raise ConfigError(
                f"--format auto found {pair.name} records ({pair.where}) and {single.name} records ({single.where}): "
                "a preference store holds pairs (chosen, rejected) and no single documents; tokenize them in two runs"
            )
        if shape.spec.chat != first.spec.chat:
            chat, plain = (first, shape) if first.spec.chat else (shape, first)
            raise ConfigError(
                f"--format auto found {chat.name} records ({chat.where}) and {plain.name} records ({plain.where}): "
                "a chat template writes the special tokens of the first, BOS/EOS are added to the second, so one "
                "store cannot hold both; tokenize them in two runs (packtool pack takes both stores)"
            )
    per_file = tuple((path, shapes.get(path, first)) for path in by_file)
    return Shape(first.format, first.spec, first.fields, True, first.where, per_file)


def _detected(candidate: Candidate, first: Sample) -> Shape:
    return Shape(InputFormat(candidate.format), candidate.spec, candidate.resolved_fields(), True, first.where)


def _check_flags(run: Shape, config: TokenizeConfig) -> None:
    """Flags a resolved shape does not read (known only once records decided it) are a usage error naming why."""
    for shape in run.all():
        _check_shape_flags(shape, config)


def _check_shape_flags(shape: Shape, config: TokenizeConfig) -> None:
    found = f"--format {config.format} {'detected' if shape.detected else 'read'} {shape.name}"
    if config.role_map is not None and not shape.spec.role_map:
        readers = list(dict.fromkeys(fmt for fmt, spec in every_shape() if spec.role_map))
        raise UsageError(
            f"--role-map applies to {' and '.join(readers)} records, but {found} ({shape.where}), leave --role-map out"
        )
    if config.assistant_turns == AssistantTurns.LAST and not shape.spec.chat:
        raise UsageError(
            f"--assistant-turns last applies to records with assistant turns, but {found} records ({shape.where}), "
            "leave --assistant-turns out"
        )
    if config.chat_template is not None and not shape.spec.chat:
        raise UsageError(
            f"--chat-template applies to records rendered by a chat template, but {found} records ({shape.where}), "
            "leave --chat-template out"
        )


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
    source, line, reason, index = sample.bad
    raise InputError(
        f"--format auto found no readable record to detect the record shape from ({sample.n_bad} bad "
        f"record{'s' if sample.n_bad != 1 else ''}, the first: {reason}{index})",
        source,
        line,
        hint="fix the records, or pass --format for the shape they should have",
    )
