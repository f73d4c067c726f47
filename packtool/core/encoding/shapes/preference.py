"""`--format preference`: TRL's standard preference records, `prompt` / `chosen` / `rejected` strings.

The format reads every preference shape DPO users hold, each a shape of its own, and the first record
decides which one a run reads, as TRL 1.16's `DPOTrainer._prepare_dataset` decides on a dataset's first
example (it extracts the prompt of every record when the first has no `prompt`, and appends the EOS text
to every completion when the first is not conversational):

    preference                          TRL standard, explicit prompt: {"prompt": str, "chosen": str, "rejected": str}
    preference-implicit                 TRL standard, implicit prompt: {"chosen": str, "rejected": str}
    conversational-preference           TRL conversational, explicit: prompt / chosen / rejected lists of messages
    conversational-preference-implicit  TRL conversational, implicit: chosen / rejected whole conversations
    ranking-sharegpt                    LLaMA-Factory: `conversations` + `chosen` / `rejected` {from, value} turns
    ranking-alpaca                      LLaMA-Factory: `instruction` / `input` + `chosen` / `rejected` strings

Every shape gives a `Pair` in TRL's terms (LLaMA-Factory's become conversational explicit-prompt records:
TRL has no shape of theirs), and the tokenize stage makes each pair two documents, chosen then rejected,
whose ids and completion targets are TRL's (`core/encoding/pairs.py`). A record of another shape than the
first one's is a bad record (file:line, or rejects.jsonl): TRL would read it differently or fail on it.
An optional top-level `tools` (a list, or a JSON string of one) goes to the template as `tools=`.
`chosen` / `rejected` / `tools` are the names TRL and LLaMA-Factory both use; no flag renames them.
"""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import FIT, Fit, Pair, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import MISSING, as_object, lookup, plain_text, structured, tools_of

CHOSEN = "chosen"
REJECTED = "rejected"
#: the keys that make TRL treat a dataset as a vision one (refused: `text_only`)
IMAGES = ("image", "images")
#: content parts that hold media (refused: `as_datasets_reads`)
MEDIA_PARTS = frozenset({"image", "image_url", "input_image", "video", "video_url", "audio", "input_audio"})
NO_IMAGES = (
    "pairs with images are not supported yet (TRL preprocesses vision preference records with the model's "
    "processor; packtool tokenizes text pairs only), drop the media or train on them with TRL's processor"
)
#: the fields besides the pair's that TRL's `is_conversational` may read (refused when they disagree: `one_reading`)
TRL_EXTRA_KEYS = ("completion", "messages")
#: a conversational TRL record's extra template arguments (refused: `no_template_kwargs`)
TEMPLATE_KWARGS = "chat_template_kwargs"
#: how a record of another shape than the run's is told apart (the end of its reason)
ONE_SHAPE = "TRL reads every record the way its dataset's first record is, make the records of one file alike"


def is_messages(value: Any) -> bool:
    """TRL's `is_conversational` on one value: a list whose first item is an object with a `role`."""
    value = structured(value)
    return isinstance(value, list) and bool(value) and isinstance(value[0], dict) and "role" in value[0]


def is_text(value: Any) -> bool:
    """A standard value as detection sees it: a string (a CSV cell holding a JSON list or object is not one)."""
    return isinstance(value, str) and not isinstance(structured(value), (list, dict))


def present(record: Any, name: str) -> Any:
    """A field of a record, or MISSING when it is absent or null (Arrow and parquet give every row every column)."""
    value = lookup(record, name) if isinstance(record, dict) else MISSING
    return MISSING if value is None else value


def side(record: dict[str, Any], name: str, conversational: bool) -> Any:
    """`prompt`, `chosen` or `rejected` of a record whose shape is standard (strings) or conversational (lists)."""
    value = present(record, name)
    if value is MISSING:
        raise ShapeError(f"missing field {name!r}")
    if conversational:
        value = structured(value)  # a CSV cell holds JSON where a list is expected; text where text is
        if isinstance(value, str):
            raise ShapeError(f"field {name!r} is a string, but the first record holds lists of messages: {ONE_SHAPE}")
        if not isinstance(value, list):
            raise ShapeError(f"field {name!r} is not a list of messages (got {type(value).__name__})")
        if not value:
            raise ShapeError(f"field {name!r} is an empty list of messages (TRL cannot read it)")
        return as_datasets_reads(name, value)
    if isinstance(value, list):
        raise ShapeError(f"field {name!r} is a list, but the first record holds strings (standard): {ONE_SHAPE}")
    if not isinstance(value, str):
        raise ShapeError(f"field {name!r} is not a string (got {type(value).__name__})")
    return plain_text(value)


def one_reading(record: dict[str, Any], conversational: bool) -> None:
    """TRL 1.16's `is_conversational` reads ONE of a record's `prompt`/`chosen`/`rejected`/`completion`/`messages`,
    popped from a set (which one changes with each process's string hashing), and on it decides the chat template
    and whether the EOS is added: a `completion` or `messages` field (null included: `datasets` gives every row
    every column) that says otherwise than the pair makes TRL's ids a coin toss, so it is refused."""
    for name in TRL_EXTRA_KEYS:
        if name in record and is_messages(record[name]) != conversational:
            what = "is not a list of messages" if conversational else "is a list of messages"
            pair = "conversational" if conversational else "standard (strings)"
            raise ShapeError(
                f"the record's {name!r} field {what} while its pair is {pair}: TRL decides whether a record is "
                "conversational from one of its prompt/chosen/rejected/completion/messages fields picked at random "
                "(its ids then vary from run to run), drop or rename the field"
            )


def no_prompt(record: dict[str, Any], fields: ShapeFields) -> None:
    """An implicit-prompt run: a record with its own prompt is not read as TRL would (it would drop it)."""
    if present(record, fields.prompt) is not MISSING:
        raise ShapeError(
            f"the record has a {fields.prompt!r} field but the first record has none (an implicit prompt that "
            f"chosen and rejected share, which TRL extracts for every record, dropping this one): {ONE_SHAPE}"
        )


def text_only(record: dict[str, Any]) -> dict[str, Any]:
    """The record, refused when it carries images: TRL preprocesses those with a vision model's processor. An
    empty or null `image`/`images` is refused too: TRL reads a dataset with such a column as vision data
    whatever its rows hold (a text model is refused, a vision model's processor tokenizes at batch time)."""
    for name in IMAGES:
        if isinstance(record, dict) and name in record:
            value = record[name]
            empty = " (empty: TRL reads a dataset with this column as vision data)" if value in (None, []) else ""
            raise ShapeError(f"the record has {name!r}{empty}: {NO_IMAGES}")
    return record


def as_datasets_reads(name: str, messages: list[Any]) -> list[Any]:
    """One column's messages as TRL gets them from `datasets.Dataset.from_list` (and a parquet table): every
    object of a kind (a message, a content part, a tool call, its arguments) holds every key that any object of
    that kind in the column holds, None where it has none, in the order the keys first appear, nested. The
    template sees them so: transformers drops a message's None keys, not a part's, and a template that prints a
    content list prints `{'type': 'text', 'text': 'Hi', 'cache_control': None}`. A media part is refused."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in MEDIA_PARTS:
                raise ShapeError(f"message {i} of field {name!r} holds a content part of type {kind!r}: {NO_IMAGES}")
    try:
        return _filled(messages, _schema([messages]))  # type: ignore[no-any-return]
    except RecursionError:
        raise ShapeError(f"field {name!r} nests objects too deeply to read (hundreds of levels), flatten it") from None


def pair_tools(record: dict[str, Any], name: str) -> list[Any] | None:
    """A conversational record's `tools` as TRL gets them: a JSON string parsed as written (TRL `json.loads` it
    per record), a list of tool objects as `datasets` reads a column (`as_datasets_reads`: a tool's parameters
    hold every property any tool of the record names, None where it has none)."""
    tools = tools_of(record, name)
    if type(present(record, name)) is not list:
        return tools
    try:
        return _filled(tools, _schema([tools]))  # type: ignore[no-any-return]
    except RecursionError:
        raise ShapeError(f"field {name!r} nests objects too deeply to read (hundreds of levels), flatten it") from None


def _schema(values: list[Any]) -> Any:
    """The keys of the objects at one place of a column (a dict of key -> the schema of its values), the schema
    of the items of its lists (a one-item list), `float` for integers beside floats (Arrow reads them all as
    float64: `1` becomes `1.0`), or None: other scalars, or values Arrow would not give one type."""
    present_ = [v for v in values if v is not None]
    if present_ and all(type(v) is dict for v in present_):
        keys: dict[str, list[Any]] = {}
        for value in present_:
            for key, item in value.items():
                keys.setdefault(key, []).append(item)
        return {key: _schema(items) for key, items in keys.items()}
    if present_ and all(type(v) is list for v in present_):
        return [_schema([item for value in present_ for item in value])]
    kinds = {type(v) for v in present_}
    return float if kinds == {int, float} else None  # Arrow gives numbers of both kinds one type: float64


def _filled(value: Any, schema: Any) -> Any:
    if type(schema) is dict and type(value) is dict:
        return {key: _filled(value.get(key), sub) for key, sub in schema.items()}
    if type(schema) is list and type(value) is list:
        return [_filled(item, schema[0]) for item in value]
    return float(value) if schema is float and type(value) is int else value


def no_template_kwargs(record: dict[str, Any]) -> None:
    """TRL passes a conversational record's `chat_template_kwargs` to the template; packtool renders with none,
    so a record that sets some would get other ids than TRL's: a bad record, never a silent difference."""
    kwargs = present(record, TEMPLATE_KWARGS)
    if kwargs is not MISSING and kwargs != {}:
        raise ShapeError(
            f"the record sets {TEMPLATE_KWARGS!r}, which packtool does not pass to the chat template (TRL does), "
            "drop the field or bake it into --chat-template"
        )


def _common_prefix(a: Any, b: Any) -> int:
    """Length of the longest common prefix of two strings or lists (slices compared in C, by halving)."""
    n = min(len(a), len(b))
    if type(a) is str:
        lo, hi = 0, n
        while lo < hi:  # a[:lo] == b[:lo] holds; find the largest such lo
            mid = (lo + hi + 1) // 2
            if a[:mid] == b[:mid]:
                lo = mid
            else:
                hi = mid - 1
        return lo
    return next((i for i in range(n) if _message(a[i]) != _message(b[i])), n)


def _message(value: Any) -> Any:
    """A message as TRL compares it: `datasets` gives every message every key (None where it has none)."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


def extract_prompt(chosen: Any, rejected: Any) -> tuple[Any, Any, Any]:
    """TRL 1.16's `extract_prompt`: (prompt, chosen, rejected) from two whole strings or conversations.

    TRL's loop: the prompt ends at the first index where they differ, one earlier when the character
    before it is a space (the space goes to the completions); when one is a prefix of the other (or
    they are equal) it ends one before the shorter's end. Records TRL cannot read (an empty side) or
    whose prompt comes out empty (no common prefix; TRL's index would even wrap to the last character
    when chosen ends in a space) are bad records.
    """
    n = min(len(chosen), len(rejected))
    if n == 0:
        empty = CHOSEN if not chosen else REJECTED
        raise ShapeError(f"field {empty!r} is empty, TRL cannot extract an implicit prompt from it")
    k = _common_prefix(chosen, rejected)
    idx = n - 1 if k == n else (k - 1 if chosen[k - 1] == " " else k)
    if idx <= 0:
        raise ShapeError(
            "chosen and rejected share no leading text to extract an implicit prompt from (TRL would make an "
            "empty or wrong prompt), give the record a 'prompt' field"
        )
    return chosen[:idx], chosen[idx:], rejected[idx:]


def convert(record: Any, options: ShapeOptions) -> Pair:
    record = text_only(as_object(record))
    one_reading(record, False)
    prompt = side(record, options.fields.prompt, False)
    tools_of(record, options.fields.tools)  # TRL parses a JSON string of tools on every record: a bad one fails
    return Pair(prompt, side(record, CHOSEN, False), side(record, REJECTED, False))


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    if not isinstance(record, dict):
        return None
    values = (present(record, fields.prompt), present(record, CHOSEN), present(record, REJECTED))
    return FIT if all(is_text(v) for v in values) else None


SPEC = ShapeSpec(
    name="preference",
    fields={"prompt": "prompt"},
    convert=convert,
    detect=detect,
    clues=("chosen/rejected",),
    rank=70,
    pairs=True,
    variants=(
        "preference-implicit",
        "conversational-preference",
        "conversational-preference-implicit",
        "ranking-sharegpt",
        "ranking-alpaca",
    ),
)
