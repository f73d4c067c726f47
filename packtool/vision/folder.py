"""A model folder's processor files, read as transformers reads them, without transformers.

The image processor settings come from `processor_config.json`'s nested `image_processor` object
when it has one (what transformers 5 saves), else from `preprocessor_config.json` (what the hub's
VLM folders ship); processor-level settings (Gemma 3's `image_seq_length`) from the top level of
`processor_config.json`; the model's own (`image_token_id`, `vision_config.spatial_merge_size`) from
`config.json`; the tokenizer's named special tokens (`extra_special_tokens`: Gemma 3's
`image_token`, `boi_token`, ...) from `tokenizer_config.json`. Every number an adapter uses is read
through `int_setting` / `float_list`, so a wrong type is a ConfigError naming the file and key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError
from packtool.formats import jsontext
from packtool.formats.sidefiles import SideFileError, read_side_file

IMAGE_PROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"
MODEL_CONFIG_FILE = "config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
MAX_JSON_BYTES = 16 << 20


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, None when the file does not exist, a ConfigError otherwise."""
    try:
        raw = jsontext.loads(read_side_file(path, MAX_JSON_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return None
    except SideFileError as exc:
        raise ConfigError(f"{path.name} is not read: {exc}, {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        raise ConfigError(f"cannot read {path.name} ({reason}), {path}, restore the model folder's file") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path.name} holds a JSON {type(raw).__name__}, not an object, {path}")
    return raw


@dataclass(frozen=True)
class ModelFolder:
    """The settings files of one model folder (see the module docstring)."""

    path: Path
    image_processor: dict[str, Any]
    image_processor_file: Path
    processor: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    tokenizer: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> ModelFolder | None:
        """The folder's settings; None when it holds no image processor (a text-only model)."""
        processor = read_json(path / PROCESSOR_FILE) or {}
        nested = processor.get("image_processor")
        image: dict[str, Any] | None
        if isinstance(nested, dict):
            image, image_file = nested, path / PROCESSOR_FILE
        else:
            image, image_file = read_json(path / IMAGE_PROCESSOR_FILE), path / IMAGE_PROCESSOR_FILE
        if image is None or not _is_image_processor(image):
            return None
        return cls(
            path=path,
            image_processor=image,
            image_processor_file=image_file,
            processor={k: v for k, v in processor.items() if not isinstance(v, dict)},
            model=read_json(path / MODEL_CONFIG_FILE) or {},
            tokenizer=read_json(path / TOKENIZER_CONFIG_FILE) or {},
        )

    @property
    def processor_class(self) -> str | None:
        for source in (self.processor, self.image_processor, self.tokenizer):
            if isinstance(source.get("processor_class"), str):
                return str(source["processor_class"])
        return None

    @property
    def model_type(self) -> str | None:
        value = self.model.get("model_type")
        return value if isinstance(value, str) else None

    @property
    def image_processor_type(self) -> str | None:
        value = self.image_processor.get("image_processor_type")
        return value if isinstance(value, str) else None

    @property
    def vision_config(self) -> dict[str, Any]:
        """config.json's `vision_config` object ({} when absent)."""
        value = self.model.get("vision_config")
        return value if isinstance(value, dict) else {}

    def special_token(self, name: str, default: str) -> str:
        """The tokenizer's named special token (`extra_special_tokens`, or a top-level key), else `default`."""
        extra = self.tokenizer.get("extra_special_tokens")
        if isinstance(extra, Mapping) and isinstance(extra.get(name), str):
            return str(extra[name])
        value = self.tokenizer.get(name)
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping) and isinstance(value.get("content"), str):
            return str(value["content"])
        return default


def _is_image_processor(raw: dict[str, Any]) -> bool:
    """An image processor config, not an audio feature extractor's (which shares the file name)."""
    return not ("feature_extractor_type" in raw and "image_processor_type" not in raw)


def token_id(vocab: Mapping[str, int], token: str, where: Path, role: str) -> int:
    """The id of `token` in the tokenizer's vocabulary, or a ConfigError saying which token is missing."""
    value = vocab.get(token)
    if not isinstance(value, int):
        raise ConfigError(
            f"the tokenizer has no {role} token {token!r}, {where}, use the model's own tokenizer "
            "(its tokenizer.json holds the family's special tokens)"
        )
    return int(value)


def int_setting(
    raw: Mapping[str, Any], key: str, default: int | None, where: Path, low: int = 1, high: int = 1 << 40
) -> int:
    """`raw[key]` as an integer in low..high (an integral float too), `default` when absent or null."""
    value = raw.get(key)
    if value is None:
        if default is None:
            raise ConfigError(f"{where.name} has no {key!r}, {where}, the model's processor needs it")
        return default
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{key!r} must be an integer from {low} to {high}, got {value!r}, {where}")
    return value


def float_setting(raw: Mapping[str, Any], key: str, default: float, where: Path) -> float:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key!r} must be a finite number, got {value!r}, {where}")
    return float(value)


def float_list(raw: Mapping[str, Any], key: str, default: list[float], where: Path) -> list[float]:
    """A per-channel list (`image_mean`, `image_std`): 3 finite numbers, or one number for all three."""
    value = raw.get(key)
    if value is None:
        return list(default)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * 3
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    ):
        raise ConfigError(f"{key!r} must be 3 numbers (one per RGB channel), got {value!r}, {where}")
    return [float(v) for v in value]


def square_setting(raw: Mapping[str, Any], key: str, default: int, where: Path) -> dict[str, Any]:
    """A `size` / `crop_size` object; an integer is a square (transformers' `get_size_dict` for square sizes)."""
    value = raw.get(key)
    if value is None:
        return {"height": default, "width": default}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"height": value, "width": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key!r} must be an object or an integer, got {value!r}, {where}")
    return dict(value)


def bool_setting(raw: Mapping[str, Any], key: str, default: bool, where: Path) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{key!r} must be true or false, got {value!r}, {where}")
    return value


def pixel_settings(
    raw: Mapping[str, Any], where: Path, resample: int, mean: list[float], std: list[float]
) -> dict[str, Any]:
    """The settings every image processor shares, read as transformers reads them: the resample filter,
    rescale (None when `do_rescale` is off), normalisation (None when `do_normalize` is off), RGB conversion."""
    do_rescale = bool_setting(raw, "do_rescale", True, where)
    do_normalize = bool_setting(raw, "do_normalize", True, where)
    return {
        "resample": int_setting(raw, "resample", resample, where, low=0, high=5),
        "rescale_factor": float_setting(raw, "rescale_factor", 1 / 255, where) if do_rescale else None,
        "image_mean": float_list(raw, "image_mean", mean, where) if do_normalize else None,
        "image_std": float_list(raw, "image_std", std, where) if do_normalize else None,
        "do_convert_rgb": bool_setting(raw, "do_convert_rgb", True, where),
    }
