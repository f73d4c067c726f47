"""`--tokenizer MODEL_DIR` as ONE object: where it is, the tokenizer, its chat template and the image processor.

A run locates the model folder once (`locate.Located`: the early start of the fast engine finds it, and hands
it here), then loads from that folder, once each: the tokenizer and its special tokens and template
(`tokenizer.py`), and, when the folder holds an image processor (`preprocessor_config.json`, or
`processor_config.json` with an `image_processor`), the family's `VisionProcessor` (`packtool.vision`),
built against the tokenizer's vocabulary. A folder with a processor reads its chat template as
transformers' AutoProcessor does: `chat_template.jinja`, else the processor's `chat_template.json`, and only
then `tokenizer_config.json`'s (which AutoProcessor would not read: a lenient fallback).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tokenizers import Tokenizer

from packtool.errors import ConfigError
from packtool.formats import jsontext
from packtool.formats.sidefiles import SideFileError, read_side_file
from packtool.progress import Progress
from packtool.stages.tokenize.engine.locate import CHAT_TEMPLATE_JINJA, CHAT_TEMPLATE_JSON, Located
from packtool.stages.tokenize.engine.template import TEMPLATE_BYTES
from packtool.stages.tokenize.engine.tokenizer import TokenizerInfo, find_tokenizer, load_tokenizer

#: the files that make a model folder a vision-language one (`packtool.vision.folder` reads them)
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


@dataclass(frozen=True)
class Model:
    """The run's model folder, located and loaded once (see the module docstring)."""

    located: Located
    tokenizer: Tokenizer
    info: TokenizerInfo  # its special tokens and chat template (the processor's, for a VLM folder)
    processor: Any = None  # packtool.vision.VisionProcessor, or None: a text-only folder

    @property
    def vision(self) -> dict[str, Any] | None:
        """What the chunk tasks rebuild the processor from (`VisionProcessor.config`), None without one."""
        return None if self.processor is None else dict(self.processor.config)


def load_model(spec: str, located: Located | None = None, progress: Progress | None = None) -> Model:
    """Load `--tokenizer SPEC` from where it was found (`located`; looked up here when the run has not yet, a hub
    name missing from the cache downloaded, its bytes reported to `progress`)."""
    located = located or find_tokenizer(spec, progress)
    tok, info = load_tokenizer(spec, progress, located)
    processor = _processor(located, tok)
    if processor is not None:
        info = _processor_template(located, info)
    return Model(located, tok, info, processor)


def _processor(located: Located, tok: Tokenizer) -> Any:
    if not any((located.folder / name).is_file() for name in PROCESSOR_FILES):
        return None  # the common case: no vocabulary listed, packtool.vision not imported
    from packtool.vision import VisionProcessor

    return VisionProcessor.from_dir(located.folder, tok.get_vocab(with_added_tokens=True))


def _processor_template(located: Located, info: TokenizerInfo) -> TokenizerInfo:
    """A VLM folder's template as AutoProcessor reads it: the `.jinja` file first, then `chat_template.json`."""
    path = located.folder / CHAT_TEMPLATE_JSON
    if info.chat_template_source == CHAT_TEMPLATE_JINJA or not path.is_file():
        return info
    try:
        raw = jsontext.loads(read_side_file(path, TEMPLATE_BYTES).decode("utf-8"))
    except (SideFileError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot read the processor's chat template ({exc}), {path}, restore the file") from None
    template = raw.get("chat_template") if isinstance(raw, dict) else None
    if not isinstance(template, str):
        raise ConfigError(f"{CHAT_TEMPLATE_JSON} holds no 'chat_template' string, {path}, restore the file")
    return replace(info, chat_template=template, chat_template_source=CHAT_TEMPLATE_JSON, chat_template_note="")
