"""Chat templates rendered as transformers renders them, and where each assistant turn sits.

Rendering follows `transformers` (`ImmutableSandboxedEnvironment`, `trim_blocks`,
`lstrip_blocks`, `raise_exception`, `tojson`, `strftime_now`, `bos_token`/`eos_token`,
`tools=None`, `documents=None`, `add_generation_prompt=False`). A template that calls
`strftime_now` (Llama 3.2) writes today's date, as transformers does, so its output changes by day. Assistant turns are located by rendering growing prefixes
of the conversation: the text added by assistant message i, from its content to the end of
the turn (the end-of-turn marker and whatever the template writes before the next message,
but not the next turn's header), is its target span. This is exact for any template whose
rendering of a prefix is a prefix of the full rendering (ChatML, Llama, Mistral, Gemma ...);
a template that rewrites earlier turns (e.g. one that drops past reasoning) is reported as a
bad record rather than guessed at.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from typing import Any

ROLES = frozenset({"system", "user", "assistant", "tool"})


class ChatRecordError(ValueError):
    """A conversation that cannot be rendered or whose assistant turns cannot be located."""


@lru_cache(maxsize=8)
def compile_template(source: str) -> Callable[..., str]:
    """Compile a chat template once per process, with transformers' environment and helpers."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:  # Llama 3.x templates date their system prompt, as transformers does
        from datetime import datetime

        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    template = env.from_string(source)
    return template.render


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages must be a non-empty list of {role in ROLES, content: str} objects."""
    if not isinstance(messages, list) or not messages:
        raise ChatRecordError(f"messages must be a non-empty list (got {type(messages).__name__})")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatRecordError(f"message {i} is not an object (got {type(message).__name__})")
        role = message.get("role")
        if role not in ROLES:
            raise ChatRecordError(f"message {i} has unknown role {role!r} (expected one of {', '.join(sorted(ROLES))})")
        if not isinstance(message.get("content"), str):
            raise ChatRecordError(f"message {i} content is not a string (got {type(message.get('content')).__name__})")
    return messages


def render_with_spans(
    render: Callable[..., str], messages: list[dict[str, Any]], bos_token: str | None, eos_token: str | None
) -> tuple[str, list[tuple[int, int]]]:
    """Render a conversation; return the text and the [start, end) char span of each assistant turn."""
    from jinja2.exceptions import TemplateError

    def run(msgs: list[dict[str, Any]]) -> str:
        try:
            return render(
                messages=msgs,
                tools=None,  # transformers passes these explicitly: `tools is not none` must be false
                documents=None,
                bos_token=bos_token or "",
                eos_token=eos_token or "",
                add_generation_prompt=False,
            )
        except TemplateError as exc:
            raise ChatRecordError(f"chat template failed: {exc}") from exc
        except Exception as exc:  # templates index and call freely; any failure is this record's
            raise ChatRecordError(f"chat template failed ({type(exc).__name__}: {exc})") from exc

    full = run(messages)
    spans: list[tuple[int, int]] = []
    before = ""
    for i, message in enumerate(messages):
        upto = run(messages[: i + 1])
        if not (upto.startswith(before) and full.startswith(upto)):
            raise ChatRecordError(
                "chat template is not prefix-stable (rendering a conversation prefix is not a prefix of the full "
                "rendering), cannot locate assistant turns exactly; use --chat-template with a plain template"
            )
        if message["role"] == "assistant":
            start = _content_start(run, messages, i, before, upto)
            if not spans or start >= spans[-1][1]:
                spans.append((start, len(upto)))
        before = upto
    return full, spans


_SENTINEL = "\ue000packtool-content\ue001"  # private-use characters: no template writes these


def _content_start(
    run: Callable[[list[dict[str, Any]]], str], messages: list[dict[str, Any]], i: int, before: str, upto: str
) -> int:
    """Where assistant message i's content begins in `upto`: render a sentinel in its place to find the header's end."""
    content = messages[i]["content"]
    probe = run([*messages[:i], {**messages[i], "content": _SENTINEL}])
    start = probe.find(_SENTINEL, len(before))
    if start >= 0 and probe[:start] == upto[:start]:
        for text in (content, content.strip()):
            if upto.startswith(text, start):
                return start
    raise ChatRecordError(
        f"chat template changes the content of assistant message {i}, cannot locate it in the rendered text"
    )
