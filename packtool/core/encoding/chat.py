"""Chat templates rendered exactly as transformers renders them, and where each assistant turn sits.

The text is `apply_chat_template(messages, tokenize=False)` of the WHOLE conversation: transformers'
Jinja environment (`ImmutableSandboxedEnvironment`, `trim_blocks`, `lstrip_blocks`, loop controls,
its `tojson`, `raise_exception`, `strftime_now`, guarded `dict`/`namespace`, the `{% generation %}`
tag), its message preparation (keys whose value is None dropped, `reasoning_content` /
`thinking` / `reasoning` aliased) and its arguments (`tools` as given or None, `documents=None`,
`add_generation_prompt=False`, the tokenizer's bos/eos tokens when it has them).

Turns are located without any prefix-stability assumption, so templates that render reasoning only
in the last turn, drop past reasoning, or always append a generation header all work:
  1. a template with `{% generation %}` blocks gives the targets itself (transformers' tracker);
  2. otherwise the conversation is rendered a second time with an invisible marker (noncharacters
     U+FDD0/U+FDD1 and the message index) around the non-blank core of every content and reasoning
     string. Markers survive `trim`, `strip`, `split('</think>')` and `in` tests, so removing them
     must give the first rendering back exactly (checked); they then pin every message's text;
  3. an assistant turn's target runs from the end of its role header (the template's own generation
     prompt, found just before that turn's first marker) through the first end-of-turn marker after
     its last marker. The header and the end-of-turn strings are measured once per template on a
     probe conversation (`calibrate`). A reasoning block the template inserts after the header is
     in the target; the text after the end-of-turn marker (newline, next header, a trailing
     generation prompt) is not.
If markers change what a template renders (it tests a content's length, say), turns are located by
counting role headers instead; if that is ambiguous too, the record is rejected with the reason.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from typing import Any

from packtool.core.encoding.turns import REASONING_FIELDS, ChatRecordError, Spans, calibrate, locate_turns

ROLES = frozenset({"system", "user", "assistant", "tool"})
_ALIASED = frozenset(REASONING_FIELDS)
__all__ = ["ROLES", "ChatRecordError", "ChatTemplate", "Spans", "load_chat_template", "render_with_spans"]


@lru_cache(maxsize=8)
def compile_template(source: str) -> Any:
    """A jinja2 Template with transformers' environment (including its `{% generation %}` tracker)."""
    import jinja2
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.ext import Extension

    _Sandbox = _sandbox_class()  # noqa: N806

    class GenerationTracker(Extension):  # transformers' AssistantTracker: records {% generation %} char spans
        tags = {"generation"}  # noqa: RUF012 (jinja's own class attribute)

        def __init__(self, environment: Any) -> None:
            super().__init__(environment)
            self.state = threading.local()
            environment.extend(activate_tracker=self.activate)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation", []), [], [], body).set_lineno(lineno)

        def _generation(self, caller: Any) -> str:
            text = caller()
            blocks = getattr(self.state, "blocks", None)
            if blocks is not None:
                start = sum(len(b) for b in blocks)
                self.state.spans.append((start, start + len(text)))
            return str(text)

        @contextmanager
        def activate(self, blocks: list[str], spans: Spans) -> Iterator[None]:
            self.state.blocks, self.state.spans = blocks, spans
            try:
                yield
            finally:
                self.state.blocks = self.state.spans = None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:  # Llama 3.x date their system prompt: output changes by day, as in transformers
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (jinja's own signature trick)
            self, rest = args[0], args[1:]
            for name in dict(*rest, **kwargs):
                TemplateNamespace.check(name)
            jinja2.utils.Namespace.__init__(self, dict(*rest, **kwargs))

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace.check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise SecurityError(f"chat templates cannot store underscore attributes on a namespace ({name!r})")

    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTracker, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    env.globals.update(dict=TemplateDict(), namespace=TemplateNamespace)
    return env.from_string(source)


def _sandbox_class() -> type:
    """transformers' ImmutableSandboxedEnvironment, with the same decisions taken faster.

    - The attribute check (`is_safe_attribute`: underscore names, function/frame/code internals,
      methods that mutate lists, dicts and sets) depends only on the object's type and the attribute
      name, so its answer is cached per (type, name).
    - `m.role` on a message dict (not a dict attribute) goes straight to the item (or undefined when
      it is absent), as jinja ends up doing anyway after two exceptions.
    - `getattr` is jinja's, inlined, without the call to `wrap_str_format` when the value is not a
      bound method called `format`/`format_map` (the only values that function changes).
    - Calling a bound builtin method (`content.strip()`, `text.split(...)`) skips `is_safe_callable`
      and `Context.call`'s context-passing lookups: a builtin method carries no `unsafe_callable`,
      `alters_data` or `jinja_pass_arg` attribute, so both would only call it.
    Together about half of a chat template's render time (docs/BENCHMARKS.md).
    """
    from types import BuiltinMethodType, MethodType

    from jinja2.runtime import missing
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    dict_attributes = frozenset(dir(dict))
    format_names = ("format", "format_map")

    class Sandbox(ImmutableSandboxedEnvironment):
        def getattr(self, obj: Any, attribute: str) -> Any:
            if type(obj) is dict and attribute not in dict_attributes:  # no such attribute: the item, or undefined
                value = obj.get(attribute, missing)
                return self.undefined(obj=obj, name=attribute) if value is missing else value
            try:
                value = getattr(obj, attribute)
            except AttributeError:
                try:
                    return obj[attribute]
                except (TypeError, LookupError):
                    pass
                return self.undefined(obj=obj, name=attribute)
            kind = type(value)
            if (kind is BuiltinMethodType or kind is MethodType) and value.__name__ in format_names:
                fmt = self.wrap_str_format(value)
                if fmt is not None:
                    return fmt
            known = self.safe.get((type(obj), attribute))
            if known is None:
                known = self.is_safe_attribute(obj, attribute, value)
            return value if known else self.unsafe_undefined(obj, attribute)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            if type(__obj) is BuiltinMethodType:  # cannot carry unsafe_callable / alters_data / jinja_pass_arg
                kwargs.pop("_block_vars", None)
                kwargs.pop("_loop_vars", None)
                try:
                    return __obj(*args, **kwargs)
                except StopIteration:
                    return __self.undefined("value was undefined because a callable raised a StopIteration exception")
            return super().call(__context, __obj, *args, **kwargs)

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.safe: dict[tuple[type, str], bool] = {}

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            key = (type(obj), attr)
            known = self.safe.get(key)
            if known is None:
                known = self.safe[key] = bool(super().is_safe_attribute(obj, attr, value))
            return known

    return Sandbox


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """A non-empty list of {role, content} objects; content a string or a list of typed parts.

    An assistant message may leave content out (or null) when it has `tool_calls` or reasoning.
    """
    if not isinstance(messages, list) or not messages:
        raise ChatRecordError(f"messages must be a non-empty list (got {type(messages).__name__})")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatRecordError(f"message {i} is not an object (got {type(message).__name__})")
        role = message.get("role")
        if role not in ROLES:
            raise ChatRecordError(f"message {i} has unknown role {role!r} (expected one of {', '.join(sorted(ROLES))})")
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise ChatRecordError(f"message {i} content part {j} is not an object with a 'type'")
                if part["type"] == "text" and not isinstance(part.get("text"), str):
                    raise ChatRecordError(f"message {i} content part {j} is a text part whose 'text' is not a string")
        elif content is None and role == "assistant" and (message.get("tool_calls") or _reasoning(message)):
            pass
        elif not isinstance(content, str):
            raise ChatRecordError(
                f"message {i} content is not a string or a list of parts (got {type(content).__name__})"
            )
    return messages


def _reasoning(message: dict[str, Any]) -> Any:
    return next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)


def prepare(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What transformers hands the template: None-valued keys dropped, reasoning aliased."""
    out = []
    for message in messages:
        if _ALIASED.isdisjoint(message) and None not in message.values():
            out.append(message)  # nothing to drop or alias: the record's own dict (the sandbox cannot change it)
            continue
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = _reasoning(message)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled template with what `calibrate` measured: the assistant header and end-of-turn strings."""

    source: str
    tokens: tuple[tuple[str, str], ...]  # (bos_token, ...), (eos_token, ...) passed to the template when defined
    header: str
    end_of_turn: tuple[str, ...]
    tagged: bool  # the template has {% generation %} blocks
    tools: list[Any] | None = field(default=None, compare=False)  # the template's `tools=` (one record's)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        try:
            return str(
                compile_template(self.source).render(
                    messages=messages,
                    tools=self.tools,  # None unless the record has tools: templates test `tools is not none`
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **dict(self.tokens),
                )
            )
        except Exception as exc:  # templates index, call and raise freely; any failure is this record's
            raise ChatRecordError(
                f"chat template cannot render this conversation ({type(exc).__name__}: {exc})"
            ) from exc

    def render_tracked(self, messages: list[dict[str, Any]]) -> tuple[str, Spans]:
        template = compile_template(self.source)
        blocks: list[str] = []
        spans: Spans = []
        try:
            with template.environment.activate_tracker(blocks, spans):
                for block in template.generate(
                    messages=messages,
                    tools=self.tools,
                    documents=None,
                    add_generation_prompt=False,
                    **dict(self.tokens),
                ):
                    blocks.append(block)
        except Exception as exc:
            raise ChatRecordError(
                f"chat template cannot render this conversation ({type(exc).__name__}: {exc})"
            ) from exc
        return "".join(blocks), spans


@lru_cache(maxsize=8)
def load_chat_template(
    source: str, bos_token: str | None, eos_token: str | None, added_tokens: tuple[str, ...]
) -> ChatTemplate:
    """Compile and calibrate once per process (`added_tokens`: the tokenizer's added token strings)."""
    compile_template(source)  # a syntax error surfaces here, once
    tokens = tuple((k, v) for k, v in (("bos_token", bos_token), ("eos_token", eos_token)) if v is not None)
    tagged = re.search(r"\{%-?\s*generation\s*-?%\}", source) is not None
    plain = ChatTemplate(source, tokens, "", (), tagged)
    header, end_of_turn = calibrate(plain, tuple(t for t in added_tokens if t.strip()), eos_token)
    return ChatTemplate(source, tokens, header, end_of_turn, tagged)


def render_with_spans(
    chat: ChatTemplate,
    messages: Any,
    last_only: bool = False,
    *,
    tools: list[Any] | None = None,
    targets: tuple[bool, ...] | None = None,
) -> tuple[str, Spans]:
    """Render a conversation; return the text and the [start, end) char span of each target turn.

    `tools` go to the template as transformers' `tools=`. `targets` says per message whether it is a
    target (only assistant messages can be); None: every assistant message is. `last_only` keeps the
    last assistant message, when it is a target.
    """
    prepared = prepare(validate_messages(messages))
    if tools is not None:
        chat = replace(chat, tools=tools)
    if chat.tagged:
        text, spans = chat.render_tracked(prepared)
    else:
        text = chat.render(prepared)
        spans = locate_turns(chat, prepared, text)
    if targets is not None:
        return text, _targets(prepared, spans, targets, last_only)
    return text, spans[-1:] if last_only else spans


def _targets(messages: list[dict[str, Any]], spans: Spans, targets: tuple[bool, ...], last_only: bool) -> Spans:
    """The spans of the target assistant messages (spans come one per assistant message, in order)."""
    if len(targets) != len(messages):
        raise ValueError(f"{len(targets)} target flags for {len(messages)} messages")  # a shape's bug
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if any(t and i not in assistants for i, t in enumerate(targets)):
        raise ValueError("only assistant messages can be targets")  # a shape's bug
    if all(targets[i] for i in assistants):  # every turn is a target: the chat rule, whatever the spans
        return spans[-1:] if last_only else spans
    if len(spans) != len(assistants):
        raise ChatRecordError(
            "cannot tell the assistant turns that are context from the targets (the template does not render a "
            "target for every assistant turn), make every assistant turn a target (TRL: move the prompt's "
            "assistant turns into a chat record)"
        )
    kept = [k for k, i in enumerate(assistants) if targets[i] and (not last_only or i == assistants[-1])]
    return [spans[k] for k in kept]
