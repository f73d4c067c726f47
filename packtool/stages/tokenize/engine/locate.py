"""`--tokenizer SPEC` -> the tokenizer.json file: a file, a model directory, or `org/name` in the local hub cache
(not there: NotCachedError, which `load_tokenizer` answers by downloading it, `download.py`).

Light on purpose (no numpy, no `tokenizers`): a run looks its tokenizer up before it imports anything
heavy, to start loading the fast engine at once (`early.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packtool.errors import TokenizerError
from packtool.formats.hub_cache import hub_cache_dir, resolve_snapshot

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
#: where transformers 5 saves a tokenizer's chat template (`save_pretrained`), named ones in the folder beside it
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
#: a processor's legacy template file: AutoProcessor reads it, AutoTokenizer does not
CHAT_TEMPLATE_JSON = "chat_template.json"


def fetch_command(spec: str) -> str:
    """The `hf` command (huggingface_hub's current CLI) that fetches what packtool reads of a tokenizer repo."""
    name, revision = split_revision(spec)
    pin = f" --revision {revision}" if revision else ""
    return f'hf download {name}{pin} --include "*.json" --include "*.jinja"'


def split_revision(spec: str) -> tuple[str, str | None]:
    """`ORG/NAME@REV` -> (`ORG/NAME`, `REV`); without `@`, (`ORG/NAME`, None)."""
    name, at, revision = spec.partition("@")
    return name, (revision if at else None)


class NotCachedError(TokenizerError):
    """`--tokenizer ORG/NAME` is not in the local hub cache: `load_tokenizer` downloads it, a lookup does not."""


def is_hub_name(spec: str) -> bool:
    """`org/name[@rev]`, not a path (`./x`, `/x`, `~/x`): what `--tokenizer` looks up in the hub cache (and
    fetches); a revision may hold slashes (`refs/pr/1`)."""
    name = split_revision(spec)[0]
    return name.count("/") == 1 and not name.startswith((".", "/", "~"))


def resolve_hub_name(spec: str) -> Path | None:
    """The cached snapshot directory holding `tokenizer.json` for `org/name[@rev]`, or None."""
    name, revision = split_revision(spec)
    if revision is not None and not revision:
        return None
    return resolve_snapshot(name, TOKENIZER_JSON, revision)


def file_name(path: Path) -> str:
    """The name a tokenizer file gives its stores (when its config has no hub name): a `tokenizer.json` is its
    model folder's, as `--tokenizer DIR` names it; any other file (`models/qwen-tiny.json`) its own stem."""
    resolved = path.resolve()
    if resolved.name == TOKENIZER_JSON or not resolved.stem:
        return resolved.parent.name
    return resolved.stem


@dataclass(frozen=True)
class Located:
    """Where `--tokenizer SPEC` is, found once per run and handed down (`early.py` starts the fast engine's load
    from it, `model.load_model` loads the tokenizer, its template and the image processor from its folder)."""

    spec: str
    tokenizer_json: Path  # as found, links not followed: a hub snapshot's files are links into its blobs/
    name: str

    @property
    def folder(self) -> Path:
        """The model folder: the tokenizer's files, its chat template, and a VLM's processor files."""
        return self.tokenizer_json.parent


def locate_model(spec: str) -> Located:
    """`locate`, as the one object a run hands down (NotCachedError: a hub name to download)."""
    path, name = locate(spec)
    return Located(spec, path, name)


def locate(spec: str) -> tuple[Path, str]:
    """Turn the --tokenizer argument into (tokenizer.json path, manifest name)."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path, file_name(path)
    if path.is_dir():
        if not (path / TOKENIZER_JSON).is_file():
            raise TokenizerError(
                f"directory {spec} has no {TOKENIZER_JSON}, expected a model directory holding one, "
                "save it with tokenizer.save_pretrained(DIR) or pass the tokenizer.json path"
            )
        return path / TOKENIZER_JSON, path.resolve().name
    if is_hub_name(spec):
        snapshot = resolve_hub_name(spec)
        if snapshot is not None:
            return snapshot / TOKENIZER_JSON, spec
        raise NotCachedError(
            f"tokenizer {spec!r} is not a path and not in the local Hugging Face cache ({hub_cache_dir()}), "
            f"download it first ({fetch_command(spec)}) or set HF_HUB_CACHE"
        )
    raise TokenizerError(
        f"tokenizer {spec!r} does not exist, expected a tokenizer.json, a model directory or a cached hub name (org/name)"
    )
