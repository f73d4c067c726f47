"""Find and load a tokenizer: a `tokenizer.json`, a model directory, or a cached hub name.

Hub names are resolved in the local Hugging Face cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
`~/.cache/huggingface/hub`, layout `models--org--name/snapshots/<rev>/`, revision from `refs/main`); a name
not there is downloaded into it with huggingface_hub (`download.py`), so a cached tokenizer never needs the
network. The chat template is read where transformers 5 saves it (`chat_template.jinja`) or, in older
folders, from `tokenizer_config.json`.
Special tokens come from `tokenizer_config.json` (then `special_tokens_map.json`); they may
be plain strings or `{"content": ...}` dicts, as transformers writes them.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from packtool.errors import TokenizerError
from packtool.formats import jsontext
from packtool.formats.files import sha256_file
from packtool.formats.sidefiles import SideFileError, read_side_file
from packtool.progress import Progress
from packtool.stages.tokenize.engine.locate import (
    CHAT_TEMPLATE_DIR,
    CHAT_TEMPLATE_JINJA,
    CHAT_TEMPLATE_JSON,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    Located,
    NotCachedError,
    fetch_command,
    is_hub_name,
    locate,
    locate_model,
    resolve_hub_name,
)
from packtool.stages.tokenize.engine.template import TEMPLATE_BYTES

__all__ = ["TOKENIZER_JSON", "TokenizerInfo", "load_tokenizer", "locate", "resolve_hub_name"]


@dataclass(frozen=True)
class TokenizerInfo:
    """Everything the pipeline needs to know about a tokenizer, small and picklable."""

    name: str
    path: str  # the tokenizer.json file
    sha256: str
    vocab_size: int
    max_id: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None
    post_bos: bool  # the tokenizer's own post-processor prepends BOS
    post_eos: bool  # ... and appends EOS
    #: where the template was read (`chat_template.jinja`, `tokenizer_config.json`), or looked for
    chat_template_source: str = TOKENIZER_CONFIG
    #: why there is no template although a file suggests one ("" when nothing does)
    chat_template_note: str = ""

    def manifest(self) -> dict[str, Any]:
        """The manifest's `tokenizer` entry."""
        return {
            "name": self.name,
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
        }


def _token_text(value: Any, key: str, path: Path) -> str | None:
    """A special token as transformers writes it: a string, `{"content": ...}`, or absent (None)."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is None or isinstance(value, str):
        return value
    raise TokenizerError(
        f'{key} in {path.name} is a {type(value).__name__}, not a string or {{"content": ...}}, {path}, fix the file'
    )


#: the largest tokenizer side file read: tokenizer_config.json lists added tokens, a few MB for the largest
SIDE_FILE_BYTES = 64 << 20


def _read_json(path: Path) -> dict[str, Any]:
    """A tokenizer side file (tokenizer_config.json, special_tokens_map.json): absent -> {}, else a JSON object."""
    if path.is_dir():
        raise TokenizerError(f"{path.name} is a directory, {path}, expected a JSON file")
    if not path.exists():
        return {}
    try:
        data = jsontext.loads(read_side_file(path, SIDE_FILE_BYTES).decode("utf-8"))
    except SideFileError as exc:
        raise TokenizerError(f"{path.name} is not read: {exc}, {path}, fix or remove the file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path.name} is not valid JSON ({exc}), {path}, fix or remove the file") from exc
    except OSError as exc:
        raise TokenizerError(f"cannot read {path.name} ({exc.strerror or exc}), {path}, check its permissions") from exc
    if not isinstance(data, dict):
        raise TokenizerError(
            f"{path.name} holds a JSON {type(data).__name__}, not an object, {path}, "
            "fix the file (transformers writes an object of settings) or remove it"
        )
    return data


def _config_name(config: dict[str, Any]) -> str | None:
    """`name_or_path` of tokenizer_config.json when it is a hub-style name (not a local path),
    so that `--tokenizer ./some/dir` still files packs under the model's real name."""
    value = config.get("name_or_path")
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip()
    if value.startswith((".", "/", "~")) or "\\" in value or ":" in value:
        return None
    return value


def _config_template(config: dict[str, Any], path: Path) -> str | dict[str, str] | None:
    """`chat_template` of tokenizer_config.json: one template, or named ones (`[{"name", "template"}, ...]`)."""
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named: dict[str, str] = {
            t["name"]: t["template"]
            for t in template
            if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        }
        if len(named) != len(template):
            raise TokenizerError(
                f"chat_template in {path.name} is a list whose entries are not all {{name, template}} objects, "
                f"{path}, fix the file"
            )
        return named
    if template is None or isinstance(template, str):
        return template
    raise TokenizerError(
        f"chat_template in {path.name} is a {type(template).__name__}, not a string, {path}, "
        "fix the file or pass --chat-template FILE"
    )


def _template_text(path: Path) -> str:
    """A template file beside the tokenizer (UTF-8 Jinja, read whole as transformers does)."""
    try:
        return read_side_file(path, TEMPLATE_BYTES).decode("utf-8")
    except SideFileError as exc:
        raise TokenizerError(f"{path.name} is not read: {exc}, {path}, fix or remove the file") from None
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"{path.name} is not UTF-8 text (byte {exc.start}), {path}, save it as UTF-8") from exc


def _file_templates(folder: Path) -> dict[str, str]:
    """The template files transformers 5 writes: `chat_template.jinja` ("default") and
    `additional_chat_templates/NAME.jinja` (NAME), as `PreTrainedTokenizerBase._from_pretrained` reads them."""
    templates: dict[str, str] = {}
    jinja = folder / CHAT_TEMPLATE_JINJA
    if jinja.exists():
        templates["default"] = _template_text(jinja)
    extra = folder / CHAT_TEMPLATE_DIR
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            templates[file.name.removesuffix(".jinja")] = _template_text(file)
    return templates


@dataclass(frozen=True)
class _Template:
    text: str | None
    source: str  # the file it was read from, relative to the tokenizer's folder
    note: str = ""  # why there is none, when a file suggests there might be one


def _chat_template(folder: Path, config: dict[str, Any], config_path: Path) -> _Template:
    """The tokenizer's default chat template where transformers 5.23's AutoTokenizer finds it.

    Template files (`chat_template.jinja`, `additional_chat_templates/*.jinja`), when any exists, replace
    tokenizer_config.json's `chat_template` whole; of named templates, the one named "default" is used, as
    `apply_chat_template` does without a name. A processor's `chat_template.json` is not the tokenizer's
    (AutoTokenizer never reads it, and its template may expect content parts, not text): refused by name."""
    files = _file_templates(folder)
    if files:
        if "default" in files:
            return _Template(files["default"], CHAT_TEMPLATE_JINJA)
        names = ", ".join(sorted(files))
        return _Template(
            None,
            f"{CHAT_TEMPLATE_DIR}/",
            f"{CHAT_TEMPLATE_DIR}/ holds named templates ({names}) but there is no {CHAT_TEMPLATE_JINJA}: "
            f"pass one with --chat-template {folder / CHAT_TEMPLATE_DIR}/NAME.jinja",
        )
    template = _config_template(config, config_path)
    if isinstance(template, dict):
        if "default" in template:
            return _Template(template["default"], TOKENIZER_CONFIG)
        names = ", ".join(sorted(template))
        return _Template(
            None,
            TOKENIZER_CONFIG,
            f"{TOKENIZER_CONFIG} names templates ({names}) but none is 'default': save the one to use "
            "to a file and pass --chat-template FILE",
        )
    if template is not None:
        return _Template(template, TOKENIZER_CONFIG)
    if (folder / CHAT_TEMPLATE_JSON).exists():
        return _Template(
            None,
            TOKENIZER_CONFIG,
            f"{CHAT_TEMPLATE_JSON} is a processor's template, which AutoTokenizer does not read: if it renders "
            "text messages, save its chat_template to a .jinja file and pass --chat-template FILE",
        )
    return _Template(None, TOKENIZER_CONFIG)


def load_tokenizer(
    spec: str, progress: Progress | None = None, located: Located | None = None
) -> tuple[Tokenizer, TokenizerInfo]:
    """Load the tokenizer and describe it: ids range, special tokens, post-processor behaviour.

    A hub name (`org/name[@rev]`) not in the local cache is downloaded into it first (`download.py`; its bytes
    reported to `progress(done, total)`). `located`: where the run already found it (nothing is looked up again)."""
    try:
        return _load_tokenizer(located or find_tokenizer(spec, progress))
    except OSError as exc:  # a directory on the way that cannot be searched, an unreadable file
        where = exc.filename if exc.filename is not None else spec
        raise TokenizerError(
            f"cannot read the tokenizer ({exc.strerror or exc}), {where}, check its permissions"
        ) from exc


def find_tokenizer(spec: str, progress: Progress | None = None) -> Located:
    """Where `--tokenizer SPEC` is, a hub name missing from the cache downloaded into it first."""
    try:
        return locate_model(spec)
    except NotCachedError:
        from packtool.stages.tokenize.engine.download import download_tokenizer

        return Located(spec, download_tokenizer(spec, progress) / TOKENIZER_JSON, spec)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else spec
        raise TokenizerError(
            f"cannot read the tokenizer ({exc.strerror or exc}), {where}, check its permissions"
        ) from exc


def _load_tokenizer(located: Located) -> tuple[Tokenizer, TokenizerInfo]:
    spec, json_path, name = located.spec, located.tokenizer_json, located.name
    try:
        tok = Tokenizer.from_file(str(json_path))
    except Exception as exc:  # the Rust side raises a plain Exception
        raise TokenizerError(
            f"cannot load tokenizer ({exc}), {json_path}, expected a Hugging Face tokenizers tokenizer.json"
        ) from exc
    config_path, special_path = json_path.parent / TOKENIZER_CONFIG, json_path.parent / SPECIAL_TOKENS_MAP
    config = _read_json(config_path)
    special = _read_json(special_path)
    name = _config_name(config) or name
    tokens: dict[str, str | None] = {}
    ids: dict[str, int | None] = {}
    for key in ("bos", "eos", "pad"):
        text = _token_text(config.get(f"{key}_token"), f"{key}_token", config_path) or _token_text(
            special.get(f"{key}_token"), f"{key}_token", special_path
        )
        tokens[key] = text
        ids[key] = tok.token_to_id(text) if text is not None else None
        if text is not None and ids[key] is None:
            raise TokenizerError(
                f"{key}_token {text!r} from {TOKENIZER_CONFIG} is not in the vocabulary, {json_path.parent}, fix the config"
            )
    template = _chat_template(json_path.parent, config, config_path)
    if template.text is None and not template.note and is_hub_name(spec) and not Path(spec).exists():
        # a snapshot fetched file by file (the old hint named tokenizer.json and tokenizer_config.json only)
        template = replace(
            template,
            note=f"if the repo has one, fetch it into the cache ({fetch_command(spec)}), else pass --chat-template FILE",
        )
    max_id = _max_id(tok)
    with_special = tok.encode("a", add_special_tokens=True).ids
    plain = tok.encode("a", add_special_tokens=False).ids
    post_bos = ids["bos"] is not None and len(with_special) > len(plain) and with_special[0] == ids["bos"]
    post_eos = ids["eos"] is not None and len(with_special) > len(plain) and with_special[-1] == ids["eos"]
    info = TokenizerInfo(
        name=name,
        path=str(json_path.resolve()),
        sha256=sha256_file(json_path),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        max_id=int(max_id),
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        pad_id=ids["pad"],
        bos_token=tokens["bos"],
        eos_token=tokens["eos"],
        chat_template=template.text,
        post_bos=post_bos,
        post_eos=post_eos,
        chat_template_source=template.source,
        chat_template_note=template.note,
    )
    return tok, info


def _max_id(tok: Tokenizer) -> int:
    """The largest id `tok` can emit, where it decides the token dtype (uint16 up to 65,535).

    Listing the vocabulary builds a dict of every token (0.2 s at 150k), so above 65,536 entries,
    where the dtype is uint32 anyway, the size stands in for it (a lower bound when ids have gaps).
    """
    size = tok.get_vocab_size(with_added_tokens=True)
    if size > 65536:
        return max([size - 1, *tok.get_added_tokens_decoder()])
    vocab = tok.get_vocab(with_added_tokens=True)
    return max(vocab.values()) if vocab else 0


_CACHE: dict[tuple[str, str], Tokenizer] = {}
_LOCK = threading.Lock()


def remember_tokenizer(path: str, sha256: str, tok: Tokenizer) -> None:
    """Make the coordinator's loaded tokenizer the one `cached_tokenizer` gives its threads."""
    with _LOCK:
        _CACHE[(path, sha256)] = tok


def cached_tokenizer(path: str, sha256: str) -> Tokenizer:
    """One Tokenizer per process (loading a 150k-vocab tokenizer takes ~0.5 s): remembered, or loaded here."""
    key = (path, sha256)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = Tokenizer.from_file(path)
        return _CACHE[key]
