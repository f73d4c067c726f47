"""A transformers `config.json` read without transformers: the JSON object and its numeric fields.

`stats --model` prices packs from a model's shape (`core.cost.CostModel.from_config`) and `packtool
audit` shrinks the shape to a tiny model (`audit.tiny`); both read the same file, and a field
holding "abc", NaN, 1e400, a list or a bool where a size belongs is refused here, by name, with
the file, before any arithmetic or allocation sees it. JSON numbers written as integral floats
(`4096.0`, `1e8`) are integers; anything else that is not an integer within the field's bounds is
a `ConfigError` naming the field, the value and the bounds.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError
from packtool.formats import jsontext
from packtool.formats.sidefiles import SideFileError, read_side_file

CONFIG_JSON = "config.json"
#: the largest width any size field may hold (no released model comes near: 2**31 - 1)
MAX_SIZE = 2**31 - 1
#: the largest config.json read (released ones are a few kB; per-layer tables of a large model, some 100 kB)
MAX_CONFIG_BYTES = 16 << 20


def config_path(path: str | os.PathLike[str]) -> Path:
    """`config.json` of a model directory, or the file itself."""
    p = Path(path).expanduser()
    return p / CONFIG_JSON if p.is_dir() else p


def read_model_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object of a transformers `config.json` (a file or a model directory holding one)."""
    file = config_path(path)
    try:
        raw = jsontext.loads(read_side_file(file, MAX_CONFIG_BYTES).decode("utf-8"))
    except SideFileError as exc:  # /dev/zero, a FIFO, a multi-GB file: never read
        raise ConfigError(
            f"model config is not read: {exc}, {file}, pass the model's transformers config.json"
        ) from None
    except FileNotFoundError:
        raise ConfigError(
            f"model config does not exist, {file}, pass a transformers config.json or a model directory"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = getattr(exc, "strerror", None) or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise ConfigError(
            f"cannot read the model config ({reason}), {file}, pass a valid transformers config.json"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"model config is a JSON {type(raw).__name__}, not a JSON object, {file}, pass a transformers config.json"
        )
    return raw


def int_field(
    raw: dict[str, Any],
    key: str,
    where: str,
    *,
    low: int = 1,
    high: int = MAX_SIZE,
    per_layer: bool = False,
) -> int | list[int] | None:
    """`raw[key]` as an integer in `low..high` (None when absent or null), or a ConfigError naming the field.

    `per_layer`: a list of such integers (one per layer, as Gemma 3n's `intermediate_size`) is accepted too.
    """
    value = raw.get(key)
    if value is None:
        return None
    if per_layer and isinstance(value, list) and value:
        return [_integer(v, key, where, low, high, value) for v in value]
    return _integer(value, key, where, low, high, value)


def first_int(raw: dict[str, Any], keys: tuple[str, ...], where: str, **bounds: Any) -> int | None:
    """The first of `keys` that `raw` holds (not null), read as `int_field` does."""
    for key in keys:
        if raw.get(key) is not None:
            value = int_field(raw, key, where, **bounds)
            return value if not isinstance(value, list) else None
    return None


def _integer(value: Any, key: str, where: str, low: int, high: int, shown: Any) -> int:
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if number is None or not low <= number <= high:
        raise ConfigError(
            f"model config field {key!r} must be an integer from {low} to {high}, got {_show(shown)}, {where}, "
            f"fix {key!r} in the config.json (a size, layer or head count of the model)"
        )
    return number


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
