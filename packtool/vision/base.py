"""The family adapter contract: one `VisionProcessor` subclass per model family, one registry.

A family adapter is the model's own processor rules, torch-free: how many tokens an image becomes
(`measure`), how the rendered chat text's placeholder is expanded (`expand`), the pixel rows the
image processor returns (`pixel_rows`), and what the model derives from the ids (`rope_positions`,
`token_types`). LLaMA-Factory's `mm_plugin.py` is the shape (one class per family behind a few
methods, one table), in small files: adding a family is one module + its test + `@register`.

An adapter is plain data (`config`, a JSON object) plus methods, so it pickles to the tokenize
workers and rebuilds from the store's manifest (`VisionProcessor.from_config`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from packtool.errors import ConfigError, FormatError, InputError

Spans = list[tuple[int, int]]


@dataclass(frozen=True)
class ImageInfo:
    """What one image becomes: `n_tokens` image tokens in the ids, the vision grid (t, h, w) in
    patches, and `n_patches` vision-encoder patches (what `--vision-budget` counts)."""

    n_tokens: int
    grid: tuple[int, int, int]
    n_patches: int


class VisionProcessor:
    """One model folder's image rules (see the module docstring). Subclasses set the class
    attributes and implement the methods; `from_dir` / `from_config` pick the subclass."""

    #: the registry key (class) / this folder's family (instance: qwen2_5_vl for the Qwen adapter, ...)
    family: str = ""
    #: registry keys this adapter also answers to (e.g. qwen2_5_vl, qwen3_vl for the Qwen adapter)
    families: ClassVar[tuple[str, ...]] = ()
    #: how a model folder names the family: config.json `model_type`, `processor_class`, `image_processor_type`
    model_types: ClassVar[tuple[str, ...]] = ()
    processor_classes: ClassVar[tuple[str, ...]] = ()
    image_processor_types: ClassVar[tuple[str, ...]] = ()
    mrope: ClassVar[bool] = False
    uses_grid: ClassVar[bool] = False
    token_type_ids: ClassVar[bool] = False

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.family = str(config["family"])
        self.image_token_id = int(config["image_token_id"])
        #: the text the chat template renders once per image
        self.placeholder = str(config["placeholder"])
        #: special tokens the model reads as media that no record's text may hold literally
        self.reserved = [str(t) for t in config.get("reserved_tokens", [])]

    # -- building -------------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, model_dir: Path, vocab: Mapping[str, int]) -> VisionProcessor | None:
        """The adapter of a model folder; None when it has no image processor (not a VLM); a
        ConfigError naming the family when it is a VLM family packtool does not support."""
        from packtool.vision.folder import ModelFolder

        folder = ModelFolder.read(Path(model_dir))
        if folder is None:
            return None
        adapter = _detect(folder)
        return adapter.build(folder, vocab)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> VisionProcessor:
        """Rebuild the adapter a store's manifest recorded (`config` is `VisionProcessor.config`)."""
        if not isinstance(config, Mapping) or not isinstance(config.get("family"), str):
            raise FormatError(
                f"the store's vision processor config has no family, got {str(config)[:80]!r}: the manifest is damaged, "
                "tokenize the store again"
            )
        adapter = REGISTRY.get(config["family"])
        if adapter is None:
            raise FormatError(
                f"vision family {config['family']!r} is unknown to this packtool (knows {supported_names()}), "
                "use the packtool version that wrote the store"
            )
        try:
            return adapter.rebuild(dict(config))
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(
                f"the store's {config['family']} vision processor config is damaged ({type(exc).__name__}: {exc}), "
                "tokenize the store again"
            ) from None

    @classmethod
    def build(cls, folder: Any, vocab: Mapping[str, int]) -> VisionProcessor:
        """The adapter from a model folder (`folder.ModelFolder`) and the tokenizer's vocabulary."""
        raise NotImplementedError

    @classmethod
    def rebuild(cls, config: dict[str, Any]) -> VisionProcessor:
        return cls(config)

    # -- the contract ---------------------------------------------------------------------------
    def measure(self, data: bytes, name: str = "image") -> ImageInfo:
        raise NotImplementedError

    def replacement(self, info: ImageInfo) -> str:
        """The text one placeholder becomes (the processor's `replace_image_token`)."""
        raise NotImplementedError

    def pixel_rows(
        self, images: Sequence[bytes], names: Sequence[str] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        raise NotImplementedError

    def rope_positions(self, ids: np.ndarray, grids: np.ndarray) -> np.ndarray | None:
        return None

    def token_types(self, ids: np.ndarray) -> np.ndarray | None:
        return None

    def expand(self, text: str, spans: Spans | None, infos: Sequence[ImageInfo]) -> tuple[str, Spans | None]:
        """`text` with the i-th placeholder replaced by `replacement(infos[i])`, as the processor's
        `get_text_with_replacements` does; target spans shifted, and split around every expansion
        (no image token, nor the text the expansion adds, is ever a target). InputError when the
        text holds a different number of placeholders than `infos` (the processor refuses too)."""
        for token in self.reserved:
            if token in text:
                raise InputError(
                    f"the chat text holds the literal special token {token!r}, which the model reads as media "
                    "with no image behind it",
                    hint="remove it from the record's text",
                )
        starts = [m.start() for m in re.finditer(re.escape(self.placeholder), text)]
        if len(starts) != len(infos):
            raise InputError(
                f"images miscounted: the rendered chat text holds {len(starts)} image placeholder(s) "
                f"{self.placeholder!r} but the record carries {len(infos)} image(s)",
                hint="give one image per image part / placeholder (a literal placeholder in the text counts too)"
                + (
                    "; fewer placeholders than images: the chat template left some images out (Gemma 3's renders "
                    "only a system turn's first text part), move them to a user turn"
                    if len(starts) < len(infos)
                    else ""
                ),
            )
        if not starts:
            return text, spans
        width = len(self.placeholder)
        pieces: list[str] = []
        new_starts: list[int] = []
        new_lens: list[int] = []
        prev = 0
        shift = 0
        for start, info in zip(starts, infos, strict=True):
            rep = self.replacement(info)
            pieces.append(text[prev:start])
            pieces.append(rep)
            new_starts.append(start + shift)
            new_lens.append(len(rep))
            shift += len(rep) - width
            prev = start + width
        pieces.append(text[prev:])
        return "".join(pieces), _shift_spans(spans, starts, width, new_starts, new_lens)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(family={self.family!r}, image_token_id={self.image_token_id})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.config == self.config  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.family))


def _shift_spans(
    spans: Spans | None, starts: list[int], width: int, new_starts: list[int], new_lens: list[int]
) -> Spans | None:
    """Map character spans of the old text onto the expanded text, cutting out each expansion."""
    if spans is None:
        return None
    old = np.asarray(starts, dtype=np.int64)
    ends = old + width
    delta = np.cumsum(np.asarray(new_lens, dtype=np.int64) - width)

    def moved(pos: int) -> int:  # a position outside every placeholder
        k = int(np.searchsorted(ends, pos, side="right"))  # placeholders ending at or before pos
        return pos + (int(delta[k - 1]) if k else 0)

    out: Spans = []
    for a, b in spans:
        cur = a
        lo = int(np.searchsorted(ends, a, side="right"))  # placeholders ending at or before a
        hi = int(np.searchsorted(old, b, side="left"))  # placeholders starting before b
        for k in range(lo, hi):  # the placeholders overlapping [a, b): cut out
            if old[k] > cur:
                out.append((moved(cur), new_starts[k]))
            cur = max(cur, int(ends[k]))
        if cur < b:
            out.append((moved(cur), moved(b)))
    return [(s, e) for s, e in out if e > s]


# -- registry --------------------------------------------------------------------------------------
REGISTRY: dict[str, type[VisionProcessor]] = {}
#: VLM families recognised but not built yet: name -> (model types, processor classes, image processor types)
UNSUPPORTED: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {}

A = TypeVar("A", bound=type[VisionProcessor])


def register(adapter: A) -> A:
    """Class decorator: the adapter answers to its `family` and `families` in `REGISTRY`."""
    for key in (adapter.family, *adapter.families):
        if key in REGISTRY:
            raise RuntimeError(f"vision family {key!r} registered twice, this is a bug")
        REGISTRY[key] = adapter
    return adapter


def unsupported(name: str, model_types: tuple[str, ...], processors: tuple[str, ...], images: tuple[str, ...]) -> None:
    UNSUPPORTED[name] = (model_types, processors, images)


def supported_names() -> str:
    return ", ".join(sorted(REGISTRY))


def _detect(folder: Any) -> type[VisionProcessor]:
    """The adapter class of a model folder: by processor class, then config.json model_type, then
    image processor type (the order in which they name the family most precisely)."""
    probes: list[tuple[str, str | None, Callable[[type[VisionProcessor]], tuple[str, ...]], int]] = [
        ("processor_class", folder.processor_class, lambda a: a.processor_classes, 1),
        ("model_type", folder.model_type, lambda a: a.model_types, 0),
        ("image_processor_type", folder.image_processor_type, lambda a: a.image_processor_types, 2),
    ]
    adapters = sorted(set(REGISTRY.values()), key=lambda a: a.family)
    for field, value, names, idx in probes:
        if not value:
            continue
        key = value.removesuffix("Fast").removesuffix("Pil") if field == "image_processor_type" else value
        for adapter in adapters:
            if key in names(adapter):
                return adapter
        for family, table in UNSUPPORTED.items():
            if key in table[idx]:
                raise ConfigError(
                    f"{family} is not supported yet ({field} {value!r} in {folder.path}); vision families "
                    f"packtool builds exactly: {supported_names()}",
                )
    seen = (
        ", ".join(f"{f}={v!r}" for f, v, _, _ in probes if v)
        or "no processor_class, model_type or image_processor_type"
    )
    raise ConfigError(
        f"unknown vision-language model family in {folder.path} ({seen}); vision families packtool "
        f"builds exactly: {supported_names()}",
    )
