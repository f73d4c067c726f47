"""LLaMA-Factory's Alpaca ranking records (read by `--format preference` when the first record has an
`instruction` and `chosen` / `rejected` strings).

LLaMA-Factory's converter (`AlpacaDatasetConverter`, `ranking: true`) builds the prompt as `--format
alpaca` does (the system prompt, the `history` pairs, the user turn = the non-empty of `instruction`
and `input` joined by a newline) and answers it with `chosen` or `rejected`. TRL has no such shape, so
the record becomes TRL's conversational explicit-prompt record: prompt = those messages, chosen =
[assistant: chosen], rejected = [assistant: rejected], and the top-level `tools`.
"""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.alpaca import alpaca_prompt
from packtool.core.encoding.shapes.base import FIT, Fit, Pair, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import as_object, tools_of
from packtool.core.encoding.shapes.preference import CHOSEN, REJECTED, is_text, present, side, text_only


def convert(record: Any, options: ShapeOptions) -> Pair:
    record = text_only(as_object(record))
    chosen, rejected = side(record, CHOSEN, False), side(record, REJECTED, False)
    prompt = alpaca_prompt(record, options.fields)
    return Pair(
        prompt,
        [{"role": "assistant", "content": chosen}],
        [{"role": "assistant", "content": rejected}],
        tools_of(record, options.fields.tools),
    )


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    if not isinstance(record, dict) or fields.instruction not in record:
        return None
    return FIT if is_text(present(record, CHOSEN)) and is_text(present(record, REJECTED)) else None


SPEC = ShapeSpec(
    name="ranking-alpaca",
    fields={"instruction": "instruction", "input": "input", "history": "history", "system": "system"},
    convert=convert,
    detect=detect,
    clues=("chosen/rejected",),
    rank=70,
    chat=True,
    pairs=True,
)
