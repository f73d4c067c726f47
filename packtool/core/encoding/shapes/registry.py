"""The registry of record shapes: `packtool.choices.InputFormat`, read here.

Every `InputFormat` value but `auto` is a shape, and the shape named N is `SPEC` in the module
`N.py` of this package (dashes as underscores); a base spec names its variants the same way. A
module is imported the first time a run asks for its shape, so `packtool --help` loads none and
a run loads the ones it reads (all of them only for `--format auto`). Everything that lists shapes
(the flag checks, `--format auto`, error texts) asks these functions.
"""

from __future__ import annotations

import importlib
from functools import cache

from packtool.choices import InputFormat
from packtool.core.encoding.shapes.base import FIELD_NAMES, ShapeSpec, flag_of
from packtool.errors import ConfigError

#: the `--format` value that is not a shape: the shape is detected from the records
AUTO = InputFormat.AUTO.value
#: the run-level flags `--format auto` takes (checked against the shape it detects)
AUTO_FLAGS = frozenset({"role_map"})


def formats() -> tuple[str, ...]:
    """Every `--format` value that names a shape, in the registry's order."""
    return tuple(f.value for f in InputFormat if f.value != AUTO)


@cache
def _load(name: str) -> ShapeSpec:
    module = importlib.import_module(f"{__package__}.{name.replace('-', '_')}")
    spec = getattr(module, "SPEC", None)
    if not isinstance(spec, ShapeSpec) or spec.name != name:
        raise TypeError(f"{module.__name__}.SPEC is not the ShapeSpec of shape {name!r}")  # a bug, tested
    return spec


@cache
def shape_spec(name: str) -> ShapeSpec:
    """The spec of shape `name` (a `--format` value or one of their variants); ConfigError for another name."""
    if name in formats():
        return _load(name)
    for base in formats():
        if name in _load(base).variants:
            return _load(name)
    raise ConfigError(f"unknown record shape {name!r}, pick one of {', '.join([*formats(), AUTO])}")


def family(fmt: str) -> tuple[ShapeSpec, ...]:
    """What `--format fmt` reads: its own shape, then its variants."""
    spec = shape_spec(fmt)
    return (spec, *(shape_spec(v) for v in spec.variants))


def every_shape() -> list[tuple[str, ShapeSpec]]:
    """(the `--format` that reads it, spec) of every shape, variants after their base."""
    return [(fmt, spec) for fmt in formats() for spec in family(fmt)]


def flags_read(fmt: str) -> frozenset[str]:
    """The shape flags (`TokenizeConfig` attributes) that `--format fmt` reads."""
    if fmt == AUTO:
        return AUTO_FLAGS
    flags = {flag_of(f) for spec in family(fmt) for f in spec.fields}
    return frozenset(flags | ({"role_map"} if any(s.role_map for s in family(fmt)) else set()))


def formats_reading(flag: str) -> list[str]:
    """The `--format` values that read `flag` (for an error naming them)."""
    return [fmt for fmt in [*formats(), AUTO] if flag in flags_read(fmt)]


def has_turns(fmt: str) -> bool:
    """Whether `--format fmt` may read records with assistant turns (`--assistant-turns` applies)."""
    return fmt == AUTO or any(spec.chat for spec in family(fmt))


def shape_flags() -> tuple[str, ...]:
    """Every flag that renames a field a shape reads, plus `--role-map`."""
    return (*(flag_of(f) for f in FIELD_NAMES), "role_map")


def default_field(shape: str, field: str) -> str | None:
    """The field a shape reads for `field` when no flag renames it (None: an unknown shape, or not read)."""
    try:
        return shape_spec(shape).fields.get(field)
    except ConfigError:
        return None
