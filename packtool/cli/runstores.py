"""`packtool run`'s lists of stores with weights, `pack.tokens_dir` (a mixture) and `stats.blend` (a load-time
blend): `STORE:W` strings and `{path, weight}` mappings, read as the command line reads `STORE:W` arguments
(`core.mixture`: a weight written `1e6`, which YAML 1.1 reads as text, is the number 1e6). Also the bounded
quoting (`show`) and the `file:line` (`at`) that every config error uses."""

from __future__ import annotations

import os
import reprlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packtool.core.mixture import check_weight, read_number
from packtool.errors import ConfigError, UsageError

Resolve = Callable[[str, str], str]
"""`(value, key) -> path`: a path of the config resolved against the YAML file's directory."""

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 6, 6, 80, 80


def show(value: Any) -> str:
    """A config value as errors quote it: bounded (a YAML alias can make a value of 10^9 items)."""
    return _REPR.repr(value)


def at(file: Path, mapping: Any, key: Any = None) -> str:
    """`file:line` of `key` in a mapping the loader read (its own line when it has none), else the file."""
    lines = getattr(mapping, "lines", {})
    line = lines.get(key, lines.get(None))
    return f"{file}:{line}" if line else str(file)


def blend_list(value: Any, resolve: Resolve, where: str) -> tuple[str, ...]:
    """`stats.blend`: a list of `STORE:W` strings and `{path, weight}` mappings, as `STORE:W` strings whose
    paths are resolved against the YAML file's directory (the weights are checked by `StatsConfig`)."""
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, dict) and set(item) <= {"path", "weight"} and isinstance(item.get("path"), str):
            weight = _yaml_number(item.get("weight", 1))
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise UsageError(
                    f"{where}: weight {show(weight)} is not a number, write `{{path: store, weight: 0.5}}`"
                )
            out.append(f"{resolve(item['path'], 'path')}:{weight!r}")
            continue
        if not isinstance(item, str) or not item:
            raise UsageError(
                f"{where}: expected STORE:W or {{path, weight}}, got {show(item)}, write `blend: [web:2, code:0.5]`"
            )
        head, sep, tail = item.rpartition(":")
        resolved = resolve(item, "path")
        if sep and head and not os.path.exists(resolved):
            resolved = f"{resolve(head, 'path')}:{tail}"
        out.append(resolved)
    if not out:
        raise UsageError(f"{where}: a blend needs pack stores, write `blend: [web:2, code:0.5]`")
    return tuple(out)


def _yaml_number(value: Any) -> Any:
    """A weight written `1e6` (YAML 1.1 reads it as text, not a number) as the number the command line reads."""
    number = read_number(value) if isinstance(value, str) else None
    return value if number is None else number


def mixture_list(
    value: Any, resolve: Resolve, where: str, file: Path
) -> tuple[Path | tuple[Path, ...], tuple[float, ...] | None]:
    """`tokens_dir` of a pack section: `STORE[:WEIGHT]`, or a list of those and of `{path, weight}` mappings.

    A `{path, weight}` mapping's bad weight is located at its own `weight:` line of `file`."""
    from packtool.stages.pack import mixture_args

    items = value if isinstance(value, list) else [value]
    specs = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("path"), str) and set(item) <= {"path", "weight"}:
            weight = _yaml_number(item.get("weight", 1))
            here = f"{where.split(', ', 1)[0]}, {at(file, item, 'weight')}"
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise UsageError(
                    f"{here}: weight {show(weight)} of {show(item['path'])} is not a number, write `weight: 2`"
                )
            try:
                check_weight(weight, repr(item["path"]))  # `.inf`, `.nan`, 0: named here, not as a missing store
            except UsageError as exc:
                raise UsageError(f"{here}: {exc}") from None
            specs.append(f"{resolve(item['path'], 'tokens_dir')}:{weight!r}")
        elif isinstance(item, str) and item:
            specs.append(resolve(item, "tokens_dir"))
        else:
            raise UsageError(
                f"{where}: expected a token store, STORE:WEIGHT, or a list of those or of {{path, weight}}, "
                f"got {show(item)}, write e.g. `tokens_dir: [out/a:2, out/b:0.5]`"
            )
    if not specs:
        raise UsageError(f"{where}: the list of token stores is empty, name at least one")
    try:
        return mixture_args(specs)
    except ConfigError as exc:  # a weight out of its domain stays a usage error (exit 2)
        raise type(exc)(f"{where}: {exc}") from None
