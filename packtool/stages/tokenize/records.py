"""One raw record -> (text, target character spans), or the reason it is a bad record.

The run's shape (`settings.shape`, resolved once by `shape.py`) converts the record
(`core.encoding.shapes`): into (text, spans) as it is (text: no spans, every token a target;
prompt-completion: the completion's span), or into a `Conversation` that the chat template renders
here, the target turns becoming the spans, or into a preference `Pair` whose three texts are rendered
here as TRL 1.16's `DPOTrainer` makes them (`PairTexts`: their targets are found on the tokens,
`core.encoding.pairs`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from packtool.choices import AssistantTurns
from packtool.core.encoding.chat import (
    ChatRecordError,
    ChatTemplate,
    load_chat_template,
    prepare,
    render_with_spans,
    validate_messages,
)
from packtool.core.encoding.encode import Spans
from packtool.core.encoding.pairs import PairTexts
from packtool.core.encoding.shapes.base import Conversation, Pair, ShapeError
from packtool.core.encoding.shapes.images import ImageRef, images_in_record, with_images
from packtool.errors import ConfigError, InputError
from packtool.stages.tokenize.engine.tokenizer import cached_tokenizer
from packtool.stages.tokenize.inputs.media import MediaError, image_bytes
from packtool.stages.tokenize.inputs.record import PlainText
from packtool.stages.tokenize.settings import ChunkSettings
from packtool.stages.tokenize.vision import VisionText, expand, measure, no_image_token


def extract(
    value: Any, settings: ChunkSettings, source: str = ""
) -> tuple[str, Spans | None] | VisionText | PairTexts | str:
    """One record of the input file `source` -> (text, target spans or None for all-target), a `VisionText`
    (the same with its images), a pair's texts, or the reason it is bad."""
    spec, options = settings.reader
    if spec.documents and isinstance(value, PlainText):  # a .txt document; a JSON string record is not one
        return value, None
    if spec.chat and settings.chat_template is None:
        raise ConfigError(
            f"--format {settings.format} needs a chat template, the tokenizer's tokenizer_config.json has none, "
            "pass --chat-template FILE"
        )
    try:
        got = spec.convert(value, options)
        if isinstance(got, Pair):
            return pair_texts(got, settings)
        if not isinstance(got, Conversation):
            held = images_in_record(value)
            if held is not None:  # never read as text alone
                raise ShapeError(
                    f"the record has {held} but is read as {spec.name} (text alone), "
                    "pass --format chat, sharegpt or alpaca (or auto) to read its images with its messages"
                )
            return got
        got = with_images(value, got)
        if got.images and settings.vision is None:
            raise ShapeError(no_processor(got.images, settings.tokenizer_path))
        images: tuple[bytes, ...] = ()
        if got.images:  # decoded and measured here, in the chunk task, before the template renders them
            images = tuple(image_bytes(ref, source, settings.media_dir) for ref in got.images)
            infos = measure(settings.vision or {}, images, [ref.label() for ref in got.images])
        text, spans = render_with_spans(
            chat_template(settings),
            got.messages,
            last_only=settings.assistant_turns == AssistantTurns.LAST,
            tools=got.tools,
            targets=got.targets,
        )
        if not images:
            if settings.vision is not None:
                no_image_token(settings.vision, text)
            return text, spans
        return VisionText(*expand(settings.vision or {}, text, spans, infos), images, infos)
    except (ChatRecordError, MediaError) as exc:
        return str(exc)
    except InputError as exc:  # the processor's: an image that does not decode, placeholders miscounted
        return str(exc)


def no_processor(images: tuple[ImageRef, ...], tokenizer: str) -> str:
    """Why a record with images is refused under a tokenizer folder without an image processor."""
    shown = ", ".join(ref.label() for ref in images[:3]) + (", ..." if len(images) > 3 else "")
    folder = tokenizer.removesuffix("/tokenizer.json")
    return (
        f"the record has {len(images)} image{'s' if len(images) > 1 else ''} ({shown}) but the tokenizer "
        f"folder {folder} has no image processor (no preprocessor_config.json), and images are never read as text: pass "
        "--tokenizer the vision-language model's folder (preprocessor_config.json beside the tokenizer), "
        "or drop the images"
    )


def pair_texts(pair: Pair, settings: ChunkSettings) -> PairTexts:
    """TRL 1.16 `DPOTrainer._prepare_dataset`'s texts of a pair. Standard: the EOS text appended to each
    completion that does not already end with it, prompt + completion (tokenized with the tokenizer's
    special tokens). Conversational: the prompt rendered with `add_generation_prompt=True`, prompt + chosen
    and prompt + rejected rendered whole, with the record's `tools` (tokenized without special tokens, as
    `apply_chat_template(tokenize=True)` does)."""
    if not pair.conversational:
        eos = settings.eos_token or ""  # a tokenizer without one is refused before the run (settings.py)
        chosen = pair.chosen if pair.chosen.endswith(eos) else pair.chosen + eos
        rejected = pair.rejected if pair.rejected.endswith(eos) else pair.rejected + eos
        return PairTexts(pair.prompt, pair.prompt + chosen, pair.prompt + rejected)
    template = chat_template(settings)
    if pair.tools is not None:
        template = replace(template, tools=pair.tools)
    prompt = template.render(prepare(validate_messages(pair.prompt)), add_generation_prompt=True)
    chosen = template.render(prepare(validate_messages(pair.prompt + pair.chosen)))
    rejected = template.render(prepare(validate_messages(pair.prompt + pair.rejected)))
    return PairTexts(prompt, chosen, rejected)


def chat_template(settings: ChunkSettings) -> ChatTemplate:
    """The run's template, compiled and calibrated once per process (cached by its inputs)."""
    return _chat_template(
        settings.tokenizer_path,
        settings.tokenizer_sha256,
        settings.chat_template or "",
        settings.bos_token,
        settings.eos_token,
    )


@lru_cache(maxsize=8)
def _chat_template(path: str, sha256: str, source: str, bos: str | None, eos: str | None) -> ChatTemplate:
    from jinja2.exceptions import TemplateSyntaxError

    tok = cached_tokenizer(path, sha256)
    added = tuple(sorted(t.content for t in tok.get_added_tokens_decoder().values()))
    try:
        return load_chat_template(source, bos, eos, added)
    except TemplateSyntaxError as exc:
        raise ConfigError(
            f"the chat template is not valid Jinja ({exc.message}, line {exc.lineno}), fix it or pass --chat-template FILE"
        ) from exc
