"""The contract of a record shape: the `ShapeSpec` its module defines, what its converter returns, its errors.

A converter turns one record into either
- `Plain`: (text, target character spans or None when every token is a target), encoded as is; or
- a `Conversation`: messages, the template's `tools=`, and per message whether it is a target; the
  chat path (`core.encoding.chat.render_with_spans`) renders it exactly as transformers'
  `apply_chat_template` does and finds each target turn's span;
- a `Pair` (shapes whose spec says `pairs`): a preference record in TRL's terms, prompt, chosen and
  rejected, which becomes TWO documents (chosen, then rejected) or none; the tokenize stage renders and
  tokenizes it as TRL's `DPOTrainer` does (`stages/tokenize/records.py`, `core/encoding/pairs.py`).
A record that does not have the shape raises `ShapeError` naming what is wrong (a per-record error:
file:line, or a line of rejects.jsonl).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

from packtool.core.encoding.shapes.roles import RoleMap
from packtool.core.encoding.turns import ChatRecordError, Spans

Plain = tuple[str, Spans | None]


class ShapeError(ChatRecordError):
    """A record that does not have its shape (a per-record error: file:line, or rejects.jsonl)."""


@dataclass(frozen=True)
class ShapeFields:
    """The record fields the shapes read, resolved for a run (each shape reads the few its spec names)."""

    text: str = "text"
    messages: str = "messages"  # chat, openai; sharegpt reads "conversations" unless overridden
    prompt: str = "prompt"
    completion: str = "completion"
    instruction: str = "instruction"
    input: str = "input"
    output: str = "output"
    system: str = "system"
    history: str = "history"
    tools: str = "tools"  # not a flag: the name TRL, OpenAI and LLaMA-Factory all use


#: ShapeFields attributes a flag can rename (`tools` cannot)
FIELD_NAMES = tuple(f.name for f in fields(ShapeFields) if f.name != "tools")


def flag_of(field: str) -> str:
    """The `TokenizeConfig` attribute (CLI flag with `-` for `_`) that names `field`: `field` for the text,
    `{field}_field` for the others (`messages_field`, ...)."""
    return "field" if field == "text" else f"{field}_field"


@dataclass(frozen=True)
class ShapeOptions:
    """What a converter reads besides the record: the field names and `--role-map`."""

    fields: ShapeFields
    role_map: RoleMap = ()


@dataclass(frozen=True)
class Conversation:
    """What the chat path renders: messages, the template's `tools=`, and which messages are targets.

    `targets` holds one flag per message: True for an assistant message whose tokens are loss targets
    (only assistant messages can be); None means every assistant message is (the chat rule).
    `--assistant-turns last` then keeps the last assistant message, when it is a target.
    """

    messages: Any  # a list of message objects once valid (`chat.validate_messages` says what is wrong)
    tools: list[Any] | None = None
    targets: tuple[bool, ...] | None = None
    #: the record's images in order (`images.ImageRef`), each an `{"type": "image"}` part of `messages`
    #: (`images.with_images` makes that canonical form); empty for a text-only record
    images: tuple[Any, ...] = ()

    @property
    def targets_from(self) -> int:
        """The index after the last assistant message that is context (TRL's prompt | completion cut); 0 if none."""
        if self.targets is None:
            return 0
        context = [
            i
            for i, (m, target) in enumerate(zip(self.messages, self.targets, strict=False))
            if not target and isinstance(m, dict) and m.get("role") == "assistant"
        ]
        return context[-1] + 1 if context else 0


@dataclass(frozen=True)
class Pair:
    """A preference record as TRL 1.16's `DPOTrainer` reads it once its prompt is extracted.

    Standard: `prompt`, `chosen`, `rejected` are strings (the EOS text is appended to the completions
    when rendered, as TRL does). Conversational: they are lists of messages (`chosen` / `rejected`
    follow `prompt`), rendered by the chat template with `tools=`; the prompt alone with
    `add_generation_prompt=True`. Each of the two sequences is prompt + completion; its targets start
    where the tokenized prompt and the tokenized sequences diverge (`core.encoding.pairs`).
    """

    prompt: Any
    chosen: Any
    rejected: Any
    tools: list[Any] | None = None

    @property
    def conversational(self) -> bool:
        return isinstance(self.prompt, list)


@dataclass(frozen=True)
class Fit:
    """One record has a shape (what `--format auto` learns from it)."""

    fields: tuple[tuple[str, str], ...] = ()  # ShapeFields found under another name than the default
    exact: bool = True  # False: the record does not contradict the shape, but does not show it either


FIT = Fit()


class Sample(NamedTuple):
    """One record `--format auto` reads: where it is (`file:line`), its value, whether it is a bare document."""

    where: str
    record: Any
    document: bool = False


@dataclass(frozen=True)
class ShapeSpec:
    """Everything packtool knows about one record shape; its module defines it as `SPEC`."""

    name: str
    """`--format NAME` (a variant: its base format's name selects it); the manifest's `input_shape.name`."""
    fields: Mapping[str, str]
    """ShapeFields attribute -> default field name, for every field the shape reads: their flags
    (`flag_of`) apply to the shape, and the manifest's `fields` records them, in this order."""
    convert: Callable[[Any, ShapeOptions], Conversation | Plain | Pair]
    """One record -> a Conversation (`chat`), (text, spans), or a Pair (`pairs`); ShapeError when it does not fit."""
    detect: Callable[[Any, ShapeFields], Fit | None]
    """Whether one record has this shape, reading these field names (the defaults under `--format auto`)."""
    clues: tuple[str, ...]
    """What `detect` looks for, as `--format auto` names it when no shape fits (`instruction/output`)."""
    rank: int
    """`--format auto`: of the shapes a record has, the highest rank wins (a refinement above its base)."""
    chat: bool = False
    """Records become conversations rendered by the chat template (`--chat-template`, `--assistant-turns`)."""
    loss: bool = True
    """Some tokens are not targets: the store has tokens.loss (False: every token is one)."""
    role_map: bool = False
    """`--role-map` applies."""
    documents: bool = False
    """A bare document (a .txt file, or a `--separator` piece of one) is this shape's text."""
    variants: tuple[str, ...] = ()
    """Shapes this `--format` also reads, chosen by the first record (`detect` with the run's fields)."""
    recorded: tuple[str, ...] = ()
    """Other `TokenizeConfig` flags the manifest's `fields` records (text: `separator`)."""
    pairs: bool = False
    """A record is a preference pair (`convert` gives a `Pair`): two documents, chosen then rejected, with
    TRL's ids and completion targets; the store is a preference store (docs/CHAT.md)."""

    def default_fields(self) -> ShapeFields:
        return ShapeFields(**self.fields)
