"""Where each assistant turn's target sits in a rendered conversation (see chat.py for the method).

`calibrate` measures, once per template, the assistant role header (the template's own generation
prompt, or, for templates whose generation prompt is empty or always rendered, the text between a
user turn's end and an assistant message) and the end-of-turn strings (the first added token the
template writes after an assistant message). `locate_turns` then finds every assistant turn of a
record from the marker positions of a second, marked rendering.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' aliases, in its order
Spans = list[tuple[int, int]]

_MARK_OPEN, _MARK_CLOSE = "\ufdd0", "\ufdd1"  # Unicode noncharacters: never in real text (checked per record)
_MARK_RE = re.compile(f"{_MARK_OPEN}(\\d+){_MARK_CLOSE}")


class ChatRecordError(ValueError):
    """A conversation that cannot be rendered or whose assistant turns cannot be located."""


class ChatTemplate(Protocol):
    """What locating turns needs of a template (chat.ChatTemplate)."""

    @property
    def header(self) -> str: ...

    @property
    def end_of_turn(self) -> tuple[str, ...]: ...

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str: ...


_PROBES: tuple[list[dict[str, str]], ...] = (
    [
        {"role": "user", "content": "Probe question one"},
        {"role": "assistant", "content": "Probe answer one"},
        {"role": "user", "content": "Probe question two"},
        {"role": "assistant", "content": "Probe answer two"},
    ],
    [
        {"role": "system", "content": "Probe system"},
        {"role": "user", "content": "Probe question one"},
        {"role": "assistant", "content": "Probe answer one"},
    ],
)


def calibrate(
    chat: ChatTemplate, added_tokens: tuple[str, ...], eos_token: str | None = None
) -> tuple[str, tuple[str, ...]]:
    """(assistant header, end-of-turn strings) of a template; ("", ()) when no probe renders.

    The end-of-turn is the first added token after an assistant's content, extended over the added
    tokens right behind it when that run reaches the tokenizer's EOS: Command R ends a reply with
    `<|END_RESPONSE|><|END_OF_TURN_TOKEN|>`, and the model must learn to generate both. A run that
    does not reach EOS stops at its first token (Llama 3's `<|eot_id|>` is followed by the NEXT
    turn's `<|start_header_id|>`, which is not the reply's).
    """
    for probe in _PROBES:
        try:
            text, anchors = unmark(chat.render(mark(probe) or probe))
        except ChatRecordError:
            continue
        ends = set()
        for i, message in enumerate(probe):
            if message["role"] == "assistant" and i in anchors:
                found = _first_of(text, added_tokens, anchors[i][-1], len(text))
                if found is not None:
                    ends.add(text[found[0] : _through_eos(text, found, added_tokens, eos_token)])
        end_of_turn = tuple(sorted(ends, key=len, reverse=True))
        return _header(chat, probe, text, anchors, end_of_turn), end_of_turn
    return "", ()


def _through_eos(text: str, first: tuple[int, int], added_tokens: tuple[str, ...], eos: str | None) -> int:
    """End of the end-of-turn marker starting at `first`: through EOS if adjacent added tokens reach it."""
    if not eos or text[first[0] : first[1]] == eos:
        return first[1]
    end = first[1]
    while (nxt := _first_of(text, added_tokens, end, end + max(map(len, added_tokens)))) is not None and nxt[0] == end:
        end = nxt[1]
        if text[nxt[0] : end] == eos:
            return end
    return first[1]


def _header(
    chat: ChatTemplate,
    probe: list[dict[str, str]],
    text: str,
    anchors: dict[int, list[int]],
    end_of_turn: tuple[str, ...],
) -> str:
    """The generation prompt when the template writes it before assistant turns, else the user->assistant glue."""
    user = min(i for i, m in enumerate(probe) if m["role"] == "user")  # the first turn: not "the last one"
    assistant = user + 1
    if user not in anchors or assistant not in anchors:
        return ""
    glue_start, glue_end = anchors[user][-1], anchors[assistant][0]
    try:
        base = chat.render(probe[: user + 1])
        prompted = chat.render(probe[: user + 1], add_generation_prompt=True)
    except ChatRecordError:
        base = prompted = ""
    if prompted.startswith(base) and prompted[len(base) :].strip():
        generation = prompted[len(base) :]
        if text.rfind(generation, glue_start, glue_end) >= 0:
            return generation
        # the prompt holds more than the header (e.g. an opening <think>): keep its longest prefix found there
        for cut in range(len(generation) - 1, 0, -1):
            if generation[:cut].strip() and text.rfind(generation[:cut], glue_start, glue_end) >= 0:
                return generation[:cut]
    glue = text[glue_start:glue_end]
    found = _first_of(glue, end_of_turn, 0, len(glue))
    return glue[found[1] :] if found is not None else glue


def _first_of(text: str, needles: tuple[str, ...], start: int, end: int) -> tuple[int, int] | None:
    """The earliest (longest on ties) occurrence of any needle within text[start:end]."""
    best: tuple[int, int] | None = None
    for needle in needles:
        at = text.find(needle, start, end)
        if at >= 0 and (best is None or at < best[0] or (at == best[0] and at + len(needle) > best[1])):
            best = (at, at + len(needle))
    return best


def locate_turns(chat: ChatTemplate, messages: list[dict[str, Any]], text: str) -> Spans:
    """The target span of every assistant message of `messages`, rendered as `text`.

    First from the text alone (`by_headers`: one render, the common case); when that is not
    certain, from a second, marked rendering (`by_markers`); else the record is rejected.
    """
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not assistants:
        return []
    spans = by_headers(chat, text, [messages[i] for i in assistants])
    if spans is None:
        spans = by_markers(chat, messages, text)
    if spans is None:
        raise ChatRecordError(
            "cannot locate the assistant turns in the rendered conversation (the template renders message text "
            "conditionally and its assistant headers are ambiguous), pass --chat-template with a template that "
            "marks them with {% generation %} blocks"
        )
    return spans


def by_markers(chat: ChatTemplate, messages: list[dict[str, Any]], text: str) -> Spans | None:
    """Spans from a rendering with every message's text marked; None when markers change the rendering."""
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    for parts in (True, False):  # a template may render list content as its repr: then mark strings only
        marked = mark(messages, parts)
        if marked is not None:
            clean, anchors = unmark(chat.render(marked))
            if clean == text:
                return [s for i in assistants if (s := _turn(chat, text, anchors, i)) is not None]
    return None


def _turn(chat: ChatTemplate, text: str, anchors: dict[int, list[int]], i: int) -> tuple[int, int] | None:
    own = anchors.get(i, [])
    lo, hi = (own[0], own[-1]) if own else (None, None)
    before = [p for j, ps in anchors.items() if j < i for p in ps if lo is None or p <= lo]
    after = [p for j, ps in anchors.items() if j > i for p in ps if hi is None or p >= hi]
    prev, nxt = max(before, default=0), min(after, default=len(text))
    start: int | None = None
    if chat.header:
        at = text.rfind(chat.header, prev, lo) if lo is not None else text.find(chat.header, prev, nxt)
        if at >= 0:
            start = at + len(chat.header)
    if start is None:
        start = lo
    if start is None:
        return None
    tail = max(start, hi if hi is not None else start)
    found = _first_of(text, chat.end_of_turn, tail, nxt)
    end = found[1] if found is not None else tail
    return (start, end) if end > start else None


def by_headers(chat: ChatTemplate, text: str, turns: list[dict[str, Any]]) -> Spans | None:
    """The k-th assistant header opens the k-th assistant turn, when that is certain, else None.

    Certain means: exactly one header per assistant message (plus at most a trailing generation
    header with no end-of-turn after it), each turn's stripped content found after its header, and
    an end-of-turn marker after that content, all before the next header.
    """
    if not chat.header or not chat.end_of_turn:
        return None
    heads = []
    at = text.find(chat.header)
    while at >= 0:
        heads.append(at)
        at = text.find(chat.header, at + len(chat.header))
    if len(heads) == len(turns) + 1 and _first_of(text, chat.end_of_turn, heads[-1], len(text)) is None:
        heads.pop()  # a trailing generation header with no turn after it
    if len(heads) != len(turns):
        return None
    spans = []
    for k, message in enumerate(turns):
        start = heads[k] + len(chat.header)
        bound = heads[k + 1] if k + 1 < len(heads) else len(text)
        content = message.get("content")
        texts = [content] if isinstance(content, str) else [p.get("text") for p in content or () if isinstance(p, dict)]
        pos = start
        for piece in texts:
            core = piece.strip() if isinstance(piece, str) else ""
            if core:
                at = text.find(core, pos, bound)
                if at < 0:
                    return None
                pos = at + len(core)
        found = _first_of(text, chat.end_of_turn, pos, bound)
        if found is None:
            return None
        spans.append((start, found[1]))
    return spans


def mark(messages: list[dict[str, Any]], parts: bool = True) -> list[dict[str, Any]] | None:
    """Messages with every content / reasoning string's non-blank core wrapped in its message's marker.

    None when some string already holds a marker character (then markers cannot be told apart).
    """
    out = []
    for i, message in enumerate(messages):
        tag = f"{_MARK_OPEN}{i}{_MARK_CLOSE}"
        message = dict(message)
        for key in ("content", *REASONING_FIELDS):
            value = message.get(key)
            if isinstance(value, str):
                if _MARK_OPEN in value or _MARK_CLOSE in value:
                    return None
                message[key] = _wrap(value, tag)
            elif key == "content" and isinstance(value, list) and parts:
                wrapped = []
                for part in value:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        if _MARK_OPEN in part["text"] or _MARK_CLOSE in part["text"]:
                            return None
                        part = {**part, "text": _wrap(part["text"], tag)}
                    wrapped.append(part)
                message[key] = wrapped
        out.append(message)
    return out


def _wrap(text: str, tag: str) -> str:
    core = text.strip()
    if not core:  # keep "" falsy; a blank string keeps its blanks (a template may strip them all)
        return text
    lead = len(text) - len(text.lstrip())
    return text[:lead] + tag + core + tag + text[lead + len(core) :]


def unmark(probe: str) -> tuple[str, dict[int, list[int]]]:
    """Remove markers: (clean text, message index -> marker positions in the clean text)."""
    anchors: dict[int, list[int]] = {}
    pieces = []
    removed = last = 0
    for m in _MARK_RE.finditer(probe):
        pieces.append(probe[last : m.start()])
        anchors.setdefault(int(m.group(1)), []).append(m.start() - removed)
        removed += m.end() - m.start()
        last = m.end()
    pieces.append(probe[last:])
    return "".join(pieces), anchors
