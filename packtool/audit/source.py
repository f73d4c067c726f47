"""MODEL -> a transformers config: a model directory, a `config.json`, or a hub name in the local cache.

No network and no weights: only `config.json` (and, with `trust_remote_code`, the model's own code
already on disk) is read. While the audit runs, huggingface_hub and transformers are switched
offline (`offline()`): `HF_HUB_OFFLINE`/`TRANSFORMERS_OFFLINE` and huggingface_hub's own switch, which
its HTTP session checks before every request, so even an `auto_map` naming another repo's code
(`org/repo--modeling_x.X`) is looked up in the local cache only; code that is not on disk is an error
that says so before transformers is asked for it. A config's size fields are read by the shared
reader (`formats.model_config`) first: a non-integer is refused by name, not met as a TypeError
inside a config class. Only causal language models can be audited; a known `model_type` whose
`auto_map` names the model's own code says whether that code or transformers' built-in class ran.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtool.audit.tiny import HEAD_COUNTS, INT_FIELDS, LAYER_KEYS, MAX_LAYERS, aliased
from packtool.errors import ConfigError, InputError
from packtool.formats.hub_cache import hub_cache_dir, resolve_snapshot
from packtool.formats.model_config import MAX_SIZE, int_field, read_model_config

CONFIG_JSON = "config.json"
MISSING = "packtool audit needs torch and transformers, pip install 'packtool[audit]'"
#: set while the audit runs: transformers and huggingface_hub read them (and huggingface_hub's constant below)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
#: the `auto_map` entries whose code the audit would run (a config class and a causal-LM class)
CODE_KEYS = ("AutoConfig", "AutoModelForCausalLM")
#: vision-language model_type -> family kind: a config.json of one of these with a `vision_config` is audited
#: with images (`vision.py`: its `AutoModelForImageTextToText`, tiny, documents holding images)
VISION_FAMILIES = {"qwen2_vl": "qwen", "qwen2_5_vl": "qwen", "qwen3_vl": "qwen", "qwen3_vl_moe": "qwen",
                   "gemma3": "gemma3"}  # fmt: skip


@dataclass(frozen=True)
class ModelSource:
    """What MODEL names: its config.json, the JSON, and the text (decoder) config transformers built."""

    path: Path
    raw: dict[str, Any]
    config: Any
    trust_remote_code: bool
    #: a vision-language family (VISION_FAMILIES): `config` is then the whole config, not its text part
    vision: bool = False


def is_vision(raw: dict[str, Any]) -> bool:
    """A config.json audited with images: a family of VISION_FAMILIES that has a vision tower."""
    return raw.get("model_type") in VISION_FAMILIES and isinstance(raw.get("vision_config"), dict)


def require_transformers() -> Any:
    """The transformers module, or a one-line error naming the extra to install."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as exc:
        raise ConfigError(MISSING) from exc
    return transformers


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """huggingface_hub and transformers offline for the duration (every hub request refused), then as before."""
    import huggingface_hub.constants as hub_constants

    saved_env = {key: os.environ.get(key) for key in OFFLINE_ENV}
    saved = hub_constants.HF_HUB_OFFLINE
    os.environ.update(OFFLINE_ENV)
    hub_constants.HF_HUB_OFFLINE = True  # read at import time from the environment: set it too
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = saved
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def transformers_quiet() -> Iterator[None]:
    """transformers' own warnings held back for the duration (then its verbosity as before).

    A tiny model built from a hostile or unusual config makes transformers warn on stderr (a `rope_type` it
    has no validator for, twice); the audit reports what failed in its table and its one error line, and
    stderr carries nothing else."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


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
            hint=f"download its config first (hf download {spec} config.json) or set HF_HUB_CACHE",
        )
    raise InputError(
        f"model {spec!r} does not exist", hint="pass a model directory, a config.json or a cached hub name (org/name)"
    )


def load_model(spec: str, trust_remote_code: bool = False) -> ModelSource:
    """MODEL's config, checked: readable, integer size fields, code on disk, buildable, a causal LM."""
    transformers = require_transformers()
    path = locate_config(spec)
    raw = read_model_config(path)
    if "model_type" not in raw:
        raise InputError(
            "config.json has no model_type", str(path), hint="pass a transformers config.json (save_pretrained)"
        )
    for key, kind, ok in (("model_type", "a string", isinstance(raw["model_type"], str)),
                          ("text_config", "a mapping", isinstance(raw.get("text_config", {}), (dict, type(None)))),
                          ("auto_map", "a mapping", isinstance(raw.get("auto_map", {}), (dict, type(None))))):  # fmt: skip
        if not ok:
            raise InputError(
                f"config.json field {key!r} must be {kind}, got {type(raw[key]).__name__}",
                str(path),
                hint=f"fix {key!r} (a transformers config.json has it as {kind})",
            )
    check_fields(raw, path, _aliases(transformers, raw))
    if trust_remote_code:
        _require_code_on_disk(raw, path)
    where = path.parent if path.name == CONFIG_JSON else path  # a directory also finds remote code beside it
    try:
        with offline():
            config = transformers.AutoConfig.from_pretrained(
                str(where), trust_remote_code=trust_remote_code, local_files_only=True
            )
    except Exception as exc:  # noqa: BLE001 - a config class rejecting the file, or its own code failing to load
        # the reason, on one line: a validator's error says which check failed on its first line, why on the next
        first = " ".join(part.strip() for part in str(exc).splitlines() if part.strip()) or type(exc).__name__
        hint = (
            "it needs the model's own code: pass --trust-remote-code if you trust it (read from disk only)"
            if "trust_remote_code" in str(exc)
            else f"this transformers ({transformers.__version__}) cannot build it; fix the config or upgrade transformers"
        )
        raise InputError(
            f"model_type {raw['model_type']!r} is not buildable ({first[:300]})", str(path), hint=hint
        ) from None
    if is_vision(raw):
        return ModelSource(path, raw, config, trust_remote_code, vision=True)
    text = config.get_text_config(decoder=True)
    _require_causal_lm(transformers, text, raw, path, trust_remote_code)
    return ModelSource(path, raw, text, trust_remote_code)


def load_config(spec: str, trust_remote_code: bool = False) -> Any:
    """The model's text (decoder) config, as transformers builds it from `config.json`."""
    return load_model(spec, trust_remote_code).config


def check_fields(raw: dict[str, Any], path: Path, aliases: dict[str, str]) -> None:
    """Every size field the tiny model reads or replaces is an integer (a per-layer list of them at most)."""
    layers = set(aliased(LAYER_KEYS, aliases))
    heads = set(aliased(HEAD_COUNTS, aliases))
    for section in (raw, raw.get("text_config")):
        if not isinstance(section, dict):
            continue
        for key in aliased(INT_FIELDS, aliases):
            high = MAX_LAYERS if key in layers else MAX_SIZE
            low = 1 if key in heads else 0
            int_field(section, key, str(path), low=low, high=high, per_layer=key not in layers)


def code_note(source: ModelSource, model_class: type | None) -> str | None:
    """Whose code was audited, when config.json's `auto_map` names the model's own code."""
    auto_map = source.raw.get("auto_map")
    if not isinstance(auto_map, dict):
        return None
    # the config's and every model class's code (`AutoModel`, `AutoModelForCausalLM`, ...); not a tokenizer's
    own = [str(v) for k, v in auto_map.items() if isinstance(v, str) and (k in CODE_KEYS or k.startswith("AutoModel"))]
    if not own:
        return None
    named = f"the model's own code ({', '.join(own)}, named by auto_map)"
    if model_class is None:
        return f"{named} {'could not be built' if source.trust_remote_code else 'was NOT used'}; no model was built"
    if model_class.__module__.startswith("transformers_modules"):
        return f"the model's own code was audited ({', '.join(own)}, from disk)"
    if source.trust_remote_code:  # allowed, yet transformers' class ran: say so, and why when it is known
        why = "" if "AutoModelForCausalLM" in auto_map else "it names no AutoModelForCausalLM, so "
        return f"{named} was NOT used: {why}transformers' built-in {model_class.__name__} was audited"
    return (
        f"{named} was NOT used: transformers' built-in {model_class.__name__} was audited instead; "
        "pass --trust-remote-code to audit the model's own code (read from disk only)"
    )


def _aliases(transformers: Any, raw: dict[str, Any]) -> dict[str, str]:
    """The config class's `attribute_map` (GPT-2's `n_embd` for `hidden_size`), when transformers knows the type."""
    try:
        cls = transformers.CONFIG_MAPPING[str(raw.get("model_type"))]
    except (KeyError, ValueError, TypeError):
        return {}
    return dict(getattr(cls, "attribute_map", {}) or {})


def _require_code_on_disk(raw: dict[str, Any], path: Path) -> None:
    """With --trust-remote-code: every module `auto_map` names for the config and the causal LM is on disk."""
    auto_map = raw.get("auto_map")
    if not isinstance(auto_map, dict):
        return
    for key in CODE_KEYS:
        ref = auto_map.get(key)
        if not isinstance(ref, str):
            continue
        repo, _, local = ref.rpartition("--")
        module = local.rsplit(".", 1)[0]
        file = module.replace(".", "/") + ".py"
        if repo:
            if resolve_snapshot(repo, file) is None:
                raise InputError(
                    f"the model's own code {file} of {repo} (auto_map {key}: {ref}) is not in the local Hugging Face "
                    f"cache ({hub_cache_dir()})",
                    str(path),
                    hint=f"packtool audit never downloads: fetch it first (hf download {repo} {file}) if you trust it",
                )
        elif not (path.parent / file).is_file():
            raise InputError(
                f"the model's own code {file} (auto_map {key}: {ref}) is not beside config.json",
                str(path),
                hint=f"put {file} in {path.parent} (the model repository's files), packtool audit never downloads",
            )


def _require_causal_lm(transformers: Any, config: Any, raw: dict[str, Any], path: Path, trust: bool) -> None:
    """Only a causal language model can be audited (documents packed for next-token training)."""
    auto_map = raw.get("auto_map")
    if trust and isinstance(auto_map, dict) and "AutoModelForCausalLM" in auto_map:
        return
    try:
        known = type(config) in transformers.AutoModelForCausalLM._model_mapping
    except Exception:  # noqa: BLE001 - a transformers without the private table: let the build decide
        return
    if not known:
        kind = " (an encoder-decoder)" if getattr(config, "is_encoder_decoder", False) else ""
        raise InputError(
            f"model_type {raw['model_type']!r} ({type(config).__name__}){kind} is not a causal language model: "
            "transformers has no AutoModelForCausalLM for it",
            str(path),
            hint="packtool audit measures decoder-only models trained on packed documents; it cannot audit this one",
        )
