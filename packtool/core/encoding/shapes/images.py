"""Images in conversation records: every shape's record becomes ONE canonical form, or is refused by name.

Users hold images in four ways, all read here after a shape made its `Conversation` (so every chat-like
shape, `--format auto` included, reads them alike; a record with images is never read as text alone):
- LLaMA-Factory: `<image>` placeholders in message text (ShareGPT `value`, chat `content`, Alpaca
  `instruction`/`input`) plus a top-level `images` list, one entry per placeholder, in order (LLaVA-Instruct
  and ShareGPT4V: a top-level `image`, one image);
- transformers / TRL: content parts `{"type": "image"}`, their images in the `images` column (in order) or on
  the part itself (`image`: a path, a `data:` URI, bytes or a `{bytes, path}` struct; `path`; `url`);
- OpenAI: `{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}` (or `input_image`);
- Hugging Face `datasets` `Image` features: `{bytes, path}` structs, wherever a reference may stand.

The canonical record (`Conversation.images` non-empty): every message's content in transformers' content-part
form, each image as `{"type": "image"}` at its place (LLaMA-Factory's `<image>` split out of the text, as its
`mm_plugin` puts the processor's image token where the placeholder was), text as `{"type": "text", "text": s}`,
and the ordered `ImageRef`s. The same records in any of the four forms give the same canonical record.
A record without images is returned unchanged (its bytes are those of a text-only run).

`<image>` counts as an image only in a record that has an `images` field (LLaMA-Factory's rule: its
number of placeholders must equal the number of images); elsewhere it is text. Refused by name (a
`ShapeError`: file:line, or rejects.jsonl): videos and audios (fields, parts), a miscounted record, an
image part with no image, a reference of an unknown type.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from packtool.core.encoding.shapes.base import Conversation, ShapeError
from packtool.core.encoding.shapes.fields import structured

#: LLaMA-Factory's `IMAGE_PLACEHOLDER` (its default; it reads the environment variable of that name)
IMAGE_PLACEHOLDER = "<image>"
#: the top-level field holding a record's images (LLaMA-Factory, TRL's vision datasets)
IMAGES = "images"
#: LLaVA's field of a record's one image (LLaVA-Instruct-150K, ShareGPT4V)
IMAGE = "image"
#: fields and part types of media this tool does not read (refused by name, never dropped)
OTHER_MEDIA_FIELDS = ("videos", "audios", "video", "audio")
OTHER_MEDIA_PARTS = frozenset({"video", "audio", "video_url", "audio_url", "input_audio", "input_video", "file"})
IMAGE_PARTS = frozenset({"image", "image_url", "input_image"})


@dataclass(frozen=True)
class ImageRef:
    """One image of a record, as the record names it: a path or URL string (a `data:` URI too), encoded
    bytes, or a `{bytes, path}` struct (`datasets`' Image feature). `where` names it in errors
    (`images[1]`, `message 0 part 2`). Resolving it to bytes is the tokenize stage's (`inputs/media.py`)."""

    value: str | bytes | dict[str, Any]
    where: str

    def label(self) -> str:
        """`images[0] 'photos/1.jpg'`, for an error line (bytes shown by their size)."""
        value = self.value
        if isinstance(value, dict):
            value = value.get("path") or value.get("bytes") or ""
        if isinstance(value, (bytes, bytearray)):
            return f"{self.where} ({len(value)} bytes)"
        shown = value if len(value) <= 60 else value[:40] + "..." + value[-12:]
        return f"{self.where} {shown!r}"


def with_images(record: Any, conversation: Conversation) -> Conversation:
    """`conversation` in canonical form with its images (see the module docstring), or as it is when the
    record carries none; ShapeError for what cannot be read exactly."""
    _no_other_media(record)
    field, listed = _listed(record)
    has_list = listed is not None
    if has_list and not isinstance(listed, (list, tuple)):
        listed = [listed]  # one image: a bare path or struct (LLaMA-Factory accepts a string)
    pool = [ImageRef(_checked(v, f"{field}[{i}]"), f"{field}[{i}]") for i, v in enumerate(listed or ())]
    messages = conversation.messages
    if not isinstance(messages, list) or not (pool or _any_image_part(messages)):
        if isinstance(messages, list) and has_list and _placeholders(messages):
            raise ShapeError(_miscounted(messages, pool, has_list))  # `<image>` with an empty list
        return conversation
    refs: list[ImageRef] = []
    out: list[Any] = []
    taken = 0  # images of the list placed so far
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts = _split(content, has_list)
        elif isinstance(content, list):
            parts = [p for j, part in enumerate(content) for p in _part(part, i, j, has_list)]
        else:
            out.append(message)  # no content (a tool call), or not a message: the chat path names the fault
            continue
        for part in parts:
            if part.get("type") != "image":
                continue
            own = part.pop("_image")
            if own is None:
                if taken >= len(pool):
                    raise ShapeError(_miscounted(messages, pool, has_list))
                own, taken = pool[taken], taken + 1
            refs.append(own)
        out.append({**message, "content": parts})
    if taken != len(pool):
        raise ShapeError(_miscounted(messages, pool, has_list))
    return replace(conversation, messages=out, images=tuple(refs))


def _listed(record: Any) -> tuple[str, Any]:
    """(field, value) of the record's images: `images`, or LLaVA's single `image` (LLaVA-Instruct, ShareGPT4V:
    `{"image": "coco/1.jpg", "conversations": [... "<image>\\n..."]}`); both is a bad record."""
    if not isinstance(record, dict):
        return IMAGES, None
    listed, single = structured(record.get(IMAGES)), structured(record.get(IMAGE))  # a CSV cell may hold JSON
    if listed is not None and single is not None:
        raise ShapeError(f"the record has both {IMAGES!r} and {IMAGE!r}, keep one of them")
    return (IMAGE, single) if single is not None else (IMAGES, listed)


def _placeholders(messages: list[Any]) -> bool:
    return any(
        isinstance(m, dict)
        and (
            (isinstance(m.get("content"), str) and IMAGE_PLACEHOLDER in m["content"])
            or (
                isinstance(m.get("content"), list)
                and any(isinstance(p, dict) and IMAGE_PLACEHOLDER in str(p.get("text") or "") for p in m["content"])
            )
        )
        for m in messages
    )


def _any_image_part(messages: list[Any]) -> bool:
    return any(
        isinstance(m, dict)
        and isinstance(m.get("content"), list)
        and any(
            isinstance(p, dict) and (p.get("type") in IMAGE_PARTS or p.get("type") in OTHER_MEDIA_PARTS)
            for p in m["content"]
        )
        for m in messages
    )


def _split(text: str, placeholders: bool) -> list[dict[str, Any]]:
    """A text as content parts: `<image>` placeholders (when the record lists images) become image slots."""
    if not placeholders or IMAGE_PLACEHOLDER not in text:
        return [{"type": "text", "text": text}]
    parts: list[dict[str, Any]] = []
    pieces = text.split(IMAGE_PLACEHOLDER)
    for k, piece in enumerate(pieces):
        if piece:
            parts.append({"type": "text", "text": piece})
        if k < len(pieces) - 1:
            parts.append({"type": "image", "_image": None})
    return parts


def _part(part: Any, i: int, j: int, placeholders: bool) -> list[dict[str, Any]]:
    """One content part in canonical form: a text part split at placeholders, an image `{"type": "image"}`
    with `_image` its own `ImageRef` or None (the next of the `images` list fills it)."""
    if not isinstance(part, dict):
        raise ShapeError(f"message {i} content part {j} is not an object with a 'type'")
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise ShapeError(f"message {i} content part {j} is a text part whose 'text' is not a string")
        return _split(text, placeholders)
    if kind in OTHER_MEDIA_PARTS:
        raise ShapeError(
            f"message {i} content part {j} is a {kind!r} part: only images are read (videos, audio and files "
            "are not), drop the part or the record"
        )
    if kind not in IMAGE_PARTS:
        raise ShapeError(f"message {i} content part {j} has type {kind!r}, which is not text or an image")
    where = f"message {i} part {j}"
    own = _own_image(part, where)
    return [{"type": "image", "_image": None if own is None else ImageRef(own, where)}]


def _own_image(part: dict[str, Any], where: str) -> Any:
    """The image an image part carries itself (None: it takes the next of the `images` list)."""
    found = []
    for key in ("image", "path", "url"):
        value = part.get(key)
        if value is not None:
            found.append((key, value))
    image_url = part.get("image_url")
    if image_url is not None:
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        if not isinstance(url, str):
            raise ShapeError(f"{where} 'image_url' has no 'url' string")
        found.append(("image_url", url))
    if len(found) > 1:
        keys = ", ".join(repr(k) for k, _ in found)
        raise ShapeError(f"{where} names its image twice ({keys}), keep one of them")
    return _checked(found[0][1], where) if found else None


def _checked(value: Any, where: str) -> str | bytes | dict[str, Any]:
    """A reference of a type an image can be given as; ShapeError for anything else."""
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict) and set(value) <= {"bytes", "path"}:
        data, path = value.get("bytes"), value.get("path")
        if isinstance(data, (bytes, bytearray)) or isinstance(path, str):
            return {"bytes": bytes(data) if data is not None else None, "path": path}
    shown = type(value).__name__ if not isinstance(value, dict) else f"an object with keys {sorted(value)[:4]}"
    raise ShapeError(f"{where} is {shown}: an image is a path, a data: URI, encoded bytes or a {{bytes, path}} struct")


def _no_other_media(record: Any) -> None:
    if not isinstance(record, dict):
        return
    for name in OTHER_MEDIA_FIELDS:
        value = record.get(name)
        if value is not None and value != [] and value != "":
            raise ShapeError(
                f"the record has {name!r}: only images are read (videos and audio are not), drop the field "
                "or the record"
            )


def _miscounted(messages: list[Any], pool: list[ImageRef], has_list: bool) -> str:
    slots = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        pieces = [content] if isinstance(content, str) else [p for p in content or () if isinstance(p, dict)]
        for piece in pieces:
            if isinstance(piece, str):
                slots += piece.count(IMAGE_PLACEHOLDER)
            elif piece.get("type") == "text" and isinstance(piece.get("text"), str):
                slots += piece["text"].count(IMAGE_PLACEHOLDER)
            elif piece.get("type") in IMAGE_PARTS and _own_image(piece, "") is None:
                slots += 1
    where = f"the record's images list holds {len(pool)}" if has_list else "the record has no 'images' field"
    return (
        f"miscounted images: the messages have {slots} {IMAGE_PLACEHOLDER} placeholders or image parts without "
        f"their own image, {where}; make them equal (one image per placeholder, in order)"
    )


def images_in_record(record: Any) -> str | None:
    """What a record holds of images or other media at its top level (`'images' (2)`), or None: a record that
    a text shape reads must hold none (it would be read as text alone)."""
    if not isinstance(record, dict):
        return None
    for name in (IMAGES, IMAGE, *OTHER_MEDIA_FIELDS):
        value = record.get(name)
        if value is not None and value != [] and value != "":
            return f"{name!r} ({len(value)})" if isinstance(value, list) else repr(name)
    return None
