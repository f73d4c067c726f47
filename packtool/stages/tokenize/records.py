"""One raw record -> (text, target character spans), or the reason it is a bad record.

Every format becomes (text, spans): text has no spans (every token is a target); prompt-completion
is `prompt + completion` with the completion as the span; chat is the rendered conversation with
the assistant turns as spans, and so are sharegpt, alpaca and TRL's conversational prompt-completion
once `core.encoding.shapes` has made them messages.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from packtool.choices import AssistantTurns, InputFormat
from packtool.core.encoding.chat import ChatRecordError, ChatTemplate, load_chat_template, render_with_spans
from packtool.core.encoding.encode import Spans
from packtool.core.encoding.shapes import (
    Conversation,
    ShapeFields,
    alpaca_conversation,
    chat_conversation,
    conversational_prompt_completion,
    sharegpt_conversation,
)
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
    if fmt == InputFormat.PROMPT_COMPLETION and not settings.conversational:
        prompt, reason = get_text_field(value, settings.prompt_field)
        if prompt is None:
            return reason or "bad prompt"
        completion, reason = get_text_field(value, settings.completion_field)
        if completion is None:
            return reason or "bad completion"
        return prompt + completion, [(len(prompt), len(prompt) + len(completion))]
    if settings.chat_template is None:
        raise ConfigError(
            f"--format {fmt} needs a chat template, the tokenizer's tokenizer_config.json has none, "
            "pass --chat-template FILE"
        )
    try:
        if fmt == InputFormat.CHAT:
            messages, reason = get_field(value, settings.messages_field)
            if reason is not None:
                return reason
            conversation = chat_conversation(messages, settings.role_map, value)
        else:
            conversation = to_conversation(value, settings)
        return render_with_spans(
            chat_template(settings),
            conversation.messages,
            last_only=settings.assistant_turns == AssistantTurns.LAST,
            tools=conversation.tools,
            targets_from=conversation.targets_from,
        )
    except ChatRecordError as exc:
        return str(exc)


def to_conversation(value: Any, settings: ChunkSettings) -> Conversation:
    """A sharegpt, alpaca or TRL conversational record as messages (ShapeError when it does not fit)."""
    fields = ShapeFields(
        messages=settings.messages_field,
        prompt=settings.prompt_field,
        completion=settings.completion_field,
        instruction=settings.instruction_field,
        input=settings.input_field,
        output=settings.output_field,
        system=settings.system_field,
        history=settings.history_field,
    )
    if settings.format == InputFormat.SHAREGPT:
        return sharegpt_conversation(value, fields, settings.role_map)
    if settings.format == InputFormat.ALPACA:
        return alpaca_conversation(value, fields)
    return conversational_prompt_completion(value, fields)


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
