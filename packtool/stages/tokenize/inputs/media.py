"""An image reference of a record -> its encoded bytes, or the one-line reason it cannot be read.

What a record may name (`core.encoding.shapes.images.ImageRef`, in the form its shape gave):
- encoded bytes (a Parquet/Arrow binary cell), or a `{bytes, path}` struct (`datasets`' `Image` feature:
  its bytes when present, else its path);
- a `data:image/...;base64,...` URI: decoded (bad base64, an empty or non-image payload: refused);
- a path: relative paths resolve against the input file's folder, or against `--media-dir DIR` when given.
  The file (links followed) must lie inside that folder: an absolute path, a `..` that climbs out, or a
  link that leads out is refused unless it lies under `--media-dir`. `file://` URIs are paths.
- `http(s)://` (or any other `scheme://`) is refused by name: packtool works offline.
The bytes are never decoded here (the family's processor measures them in the chunk task); a file that is
not a regular file, is empty, or is larger than `MAX_IMAGE_BYTES` is refused. Every refusal is a
`MediaError` whose text names the reference; the run turns it into file:line or a line of rejects.jsonl.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

from packtool.core.encoding.shapes.images import ImageRef

#: the largest encoded image read (a 16k x 16k PNG is well below): more is refused, never read whole
MAX_IMAGE_BYTES = 256 << 20
_REMOTE_HINT = (
    "packtool works offline: download it and name the local file (with --media-dir DIR when it lies elsewhere)"
)


class MediaError(ValueError):
    """An image that cannot be read: its reference and why (a per-record error)."""


def image_bytes(ref: ImageRef, source: str, media_dir: str | None) -> bytes:
    """The encoded bytes `ref` names, for a record of the input file `source` (see the module docstring)."""
    value = ref.value
    if isinstance(value, dict):
        data = value.get("bytes")
        if data is not None:
            return _nonempty(bytes(data), ref)
        value = value.get("path") or ""
    if isinstance(value, (bytes, bytearray)):
        return _nonempty(bytes(value), ref)
    text = value.strip()
    if text[:5].lower() == "data:":
        return _data_uri(text, ref)
    scheme = urlsplit(text).scheme.lower() if "://" in text else ""
    if scheme == "file":
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise MediaError(f"image {ref.label()} is a file:// URI on host {parts.netloc!r}, {_REMOTE_HINT}")
        text = unquote(parts.path)
    elif scheme:
        raise MediaError(f"image {ref.label()} is a remote {scheme}:// URL, {_REMOTE_HINT}")
    return _file(text, ref, Path(source).parent, media_dir)


def _nonempty(data: bytes, ref: ImageRef) -> bytes:
    if not data:
        raise MediaError(f"image {ref.label()} holds no bytes")
    if len(data) > MAX_IMAGE_BYTES:
        raise MediaError(f"image {ref.label()} holds {len(data)} bytes, more than the {MAX_IMAGE_BYTES} an image may")
    return data


def _data_uri(text: str, ref: ImageRef) -> bytes:
    """`data:image/png;base64,....` decoded; anything else refused by name."""
    head, comma, payload = text.partition(",")
    if not comma:
        raise MediaError(f"image {ref.where} is a data: URI without a ',' before its data")
    params = [p.strip().lower() for p in head[5:].split(";")]
    kind = params[0] if params else ""
    if kind and not kind.startswith("image/"):
        raise MediaError(f"image {ref.where} is a data: URI of type {kind!r}, not an image")
    if "base64" not in params[1:]:
        raise MediaError(f"image {ref.where} is a data: URI that is not base64 (';base64,' expected)")
    try:
        data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaError(f"image {ref.where} is a data: URI whose base64 does not decode ({exc})") from None
    return _nonempty(data, ref)


@lru_cache(maxsize=64)
def _roots(folder: str, media_dir: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(--media-dir, the folders a relative path is looked up in, in order), links followed, once per process."""
    media = os.path.realpath(media_dir) if media_dir is not None else None
    return media, tuple(b for b in (media, os.path.realpath(folder)) if b is not None)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _file(name: str, ref: ImageRef, folder: Path, media_dir: str | None) -> bytes:
    """A path's bytes: relative to `--media-dir` (when given, first) or to the input's folder; the file must
    lie inside the folder it was found from, or anywhere under `--media-dir` (absolute paths: only there)."""
    if not name or "\x00" in name:
        raise MediaError(f"image {ref.label()} is not a path")
    media, bases = _roots(str(folder), media_dir)
    absolute = os.path.isabs(name)
    candidates = [name] if absolute else [os.path.join(base, name) for base in bases]
    for k, path in enumerate(candidates):
        if k + 1 < len(candidates) and not os.path.lexists(path):
            continue  # not under --media-dir: the input's folder next
        try:
            resolved = os.path.realpath(path)
        except (OSError, ValueError) as exc:  # a link loop
            raise MediaError(f"image {ref.label()} cannot be resolved ({exc})") from None
        inside = (media is not None and _inside(resolved, media)) or (not absolute and _inside(resolved, bases[k]))
        if not inside:
            how = "is an absolute path" if absolute else "leads outside its folder"
            where = f"--media-dir {media}" if media is not None else f"the input's folder {bases[0]}"
            raise MediaError(
                f"image {ref.label()} {how} (to {resolved}), not inside {where}: pass --media-dir DIR holding it "
                "to allow it"
            )
        return _read(resolved, ref)
    raise MediaError(f"image {ref.label()} is missing (no file {candidates[0]})")  # never: the last one is read


def _read(resolved: str, ref: ImageRef) -> bytes:
    """The bytes of a regular file of at most MAX_IMAGE_BYTES (opened once: checked on the open file)."""
    try:
        with open(resolved, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise MediaError(f"image {ref.label()} is not a regular file ({resolved})")
            if info.st_size > MAX_IMAGE_BYTES:
                raise MediaError(
                    f"image {ref.label()} is {info.st_size} bytes, more than the {MAX_IMAGE_BYTES} an image may"
                )
            data = fh.read()  # the size is known: no buffer of the limit allocated; _nonempty checks it again
    except FileNotFoundError:
        raise MediaError(f"image {ref.label()} is missing (no file {resolved})") from None
    except IsADirectoryError:
        raise MediaError(f"image {ref.label()} is not a regular file ({resolved})") from None
    except OSError as exc:
        raise MediaError(f"image {ref.label()} cannot be read ({exc.strerror or exc})") from None
    return _nonempty(data, ref)
