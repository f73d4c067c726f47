"""One raw record -> (text, target character spans), or the reason it is a bad record.

Every format becomes (text, spans): text has no spans (every token is a target); prompt-completion
is `prompt + completion` with the completion as the span; chat is the rendered conversation with
the assistant turns as spans.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from packtool.choices import AssistantTurns, InputFormat
from packtool.core.encoding.chat import ChatRecordError, ChatTemplate, load_chat_template, render_with_spans
from packtool.core.encoding.encode import Spans
from packtool.errors import ConfigError
from packtool.stages.tokenize.settings import ChunkSettings
from packtool.stages.tokenize.sources import get_field, get_text_field
from packtool.stages.tokenize.streams import PlainText
from packtool.stages.tokenize.tokenizer import cached_tokenizer


def extract(value: Any, settings: ChunkSettings) -> tuple[str, Spans | None] | str:
    """One record -> (text, target spans or None for all-target), or the reason it is bad."""
    fmt = settings.format
    if fmt == InputFormat.TEXT:
        if isinstance(value, PlainText):  # a .txt document; a JSON string record is not one
            return value, None
        text, reason = get_text_field(value, settings.field)
        return (reason or "bad text field") if text is None else (text, None)
    if fmt == InputFormat.PROMPT_COMPLETION:
        prompt, reason = get_text_field(value, settings.prompt_field)
        if prompt is None:
            return reason or "bad prompt"
        completion, reason = get_text_field(value, settings.completion_field)
        if completion is None:
            return reason or "bad completion"
        return prompt + completion, [(len(prompt), len(prompt) + len(completion))]
    messages, reason = get_field(value, settings.messages_field)
    if reason is not None:
        return reason
    if settings.chat_template is None:
        raise ConfigError(
            "--format chat needs a chat template, the tokenizer's tokenizer_config.json has none, pass --chat-template FILE"
        )
    try:
        return render_with_spans(
            chat_template(settings), messages, last_only=settings.assistant_turns == AssistantTurns.LAST
        )
    except ChatRecordError as exc:
        return str(exc)


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
