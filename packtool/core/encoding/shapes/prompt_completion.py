"""`--format prompt-completion`: `prompt + completion` as one text, the completion (and EOS) the target.

When the first record's prompt is a list of messages (as TRL decides on a dataset's first example) the
format reads TRL's conversational prompt-completion instead, a variant of its own
(`conversational_prompt_completion.py`).
"""

from __future__ import annotations

from typing import Any

from packtool.core.encoding.shapes.base import FIT, Fit, Plain, ShapeError, ShapeFields, ShapeOptions, ShapeSpec
from packtool.core.encoding.shapes.fields import get_text_field


def convert(record: Any, options: ShapeOptions) -> Plain:
    prompt, reason = get_text_field(record, options.fields.prompt)
    if prompt is None:
        raise ShapeError((reason or "bad prompt") + _hint(record))
    completion, reason = get_text_field(record, options.fields.completion)
    if completion is None:
        raise ShapeError((reason or "bad completion") + _hint(record))
    return prompt + completion, [(len(prompt), len(prompt) + len(completion))]


def _hint(record: Any) -> str:
    from packtool.core.encoding.shapes.detect import other_format_hint  # detect imports every shape: lazily

    return other_format_hint(record, "prompt-completion")


def detect(record: Any, fields: ShapeFields) -> Fit | None:
    if not isinstance(record, dict):
        return None
    return (
        FIT if isinstance(record.get(fields.prompt), str) and isinstance(record.get(fields.completion), str) else None
    )


SPEC = ShapeSpec(
    name="prompt-completion",
    fields={"prompt": "prompt", "completion": "completion"},
    convert=convert,
    detect=detect,
    clues=("prompt/completion",),
    rank=30,
    variants=("conversational-prompt-completion",),
)
