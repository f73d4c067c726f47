"""MODEL -> a transformers config: a model directory, a `config.json`, or a hub name in the local cache.

No network and no weights: only `config.json` is read. A config whose `model_type` the installed
transformers does not know needs the model's own code, which is loaded only with
`trust_remote_code=True` (and then only from files already on disk).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError, InputError
from packtool.formats.hub_cache import hub_cache_dir, resolve_snapshot

CONFIG_JSON = "config.json"
MISSING = "packtool audit needs torch and transformers, pip install 'packtool[audit]'"


def require_transformers() -> Any:
    """The transformers module, or a one-line error naming the extra to install."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        raise ConfigError(MISSING) from exc
    return transformers


def locate_config(spec: str) -> Path:
    """The `config.json` that MODEL names (file, directory, or `org/name` in the hub cache)."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if not (path / CONFIG_JSON).is_file():
            raise InputError(
                f"model directory has no {CONFIG_JSON}",
                str(path),
                hint="pass a transformers model directory (save_pretrained) or its config.json",
            )
        return path / CONFIG_JSON
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        snapshot = resolve_snapshot(spec, CONFIG_JSON)
        if snapshot is not None:
            return snapshot / CONFIG_JSON
        raise InputError(
            f"model {spec!r} is not a path and not in the local Hugging Face cache ({hub_cache_dir()})",
            hint=f"download its config first (huggingface-cli download {spec} config.json) or set HF_HUB_CACHE",
        )
    raise InputError(
        f"model {spec!r} does not exist", hint="pass a model directory, a config.json or a cached hub name (org/name)"
    )


def load_config(spec: str, trust_remote_code: bool = False) -> Any:
    """The model's text (decoder) config, as transformers builds it from `config.json`."""
    transformers = require_transformers()
    path = locate_config(spec)
    try:
        raw = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read the model config ({exc})", str(path), hint="pass a valid config.json") from exc
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise InputError(
            "config.json has no model_type", str(path), hint="pass a transformers config.json (save_pretrained)"
        )
    where = path.parent if path.name == CONFIG_JSON else path  # a directory also finds remote code beside it
    try:
        config = transformers.AutoConfig.from_pretrained(str(where), trust_remote_code=trust_remote_code)
    except ValueError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = (
            "it needs the model's own code: pass --trust-remote-code if you trust it"
            if "trust_remote_code" in str(exc)
            else f"this transformers ({transformers.__version__}) cannot build it; upgrade transformers"
        )
        raise InputError(
            f"model_type {raw['model_type']!r} is not buildable ({first[:160]})", str(path), hint=hint
        ) from exc
    return config.get_text_config(decoder=True)
