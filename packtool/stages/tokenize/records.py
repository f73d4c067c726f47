"""One raw record -> (text, target character spans), or the reason it is a bad record.

Every format becomes (text, spans): text has no spans (every token is a target); prompt-completion
is `prompt + completion` with the completion as the span; chat is the rendered conversation with
the assistant turns as spans.
"""

from __future__ import annotations

from typing import Any

from packtool.choices import InputFormat
from packtool.core.encoding.chat import ChatRecordError, compile_template, render_with_spans, validate_messages
from packtool.core.encoding.encode import Spans
from packtool.errors import ConfigError
from packtool.stages.tokenize.settings import ChunkSettings
from packtool.stages.tokenize.sources import get_field, get_text_field
from packtool.stages.tokenize.streams import PlainText


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
            compile_template(settings.chat_template),
            validate_messages(messages),
            settings.bos_token,
            settings.eos_token,
        )
    except ChatRecordError as exc:
        return str(exc)
