"""`ChunkSettings`, the small picklable settings every chunk task gets, how a run's are made from its config
and shape (`chunk_settings`), and how BOS/EOS are resolved."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from packtool.choices import AssistantTurns
from packtool.core.encoding.encode import SpecialPolicy
from packtool.core.encoding.shapes.base import ShapeFields, ShapeOptions, ShapeSpec, flag_of
from packtool.core.encoding.shapes.registry import shape_flags, shape_spec
from packtool.core.encoding.shapes.roles import parse_role_map
from packtool.errors import ConfigError, FormatError, UsageError
from packtool.formats.token_store import dtype_for_max_id, dtype_name
from packtool.stages.tokenize.config import TokenizeConfig
from packtool.stages.tokenize.engine.template import check_chat_template, read_chat_template
from packtool.stages.tokenize.engine.tokenizer import TokenizerInfo
from packtool.stages.tokenize.inputs.chunk import Chunk
from packtool.stages.tokenize.inputs.record import DEFAULT_MAX_RECORD_BYTES
from packtool.stages.tokenize.journal import work_dir_for
from packtool.stages.tokenize.shape import Shape


@dataclass(frozen=True)
class ChunkSettings:
    """Everything `tokenize_chunk` needs besides the chunk: picklable, and hashed into resume keys."""

    tokenizer_path: str
    tokenizer_sha256: str
    format: str  # the --format that reads the records (never auto)
    shape: str  # the shape it reads them as: the format's own, or a variant (TRL's conversational)
    fields: ShapeFields  # the record fields the shape reads
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    separator: str | None
    on_error: str
    policy: SpecialPolicy
    dtype: str
    work_dir: str
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    threads: int = 1
    backend: str = "hf"  # "hf" or "fast": the ids are identical (verified), so not in the fingerprint
    assistant_turns: str = "all"  # chat shapes: "all" or "last" assistant turns are targets
    role_map: tuple[tuple[str, str], ...] = ()  # --role-map pairs, for the shapes that read them
    loss: bool = True  # some tokens are not targets (every shape but text): the store has tokens.loss
    #: `--format auto` that found several shapes: (path, format, shape, fields, loss) of every input file; a
    #: chunk reads its file's (`for_chunk`). Empty when one shape reads every file (the fields above).
    by_source: tuple[tuple[str, str, str, ShapeFields, bool], ...] = ()
    #: the model folder's image processor (`VisionProcessor.config`), None when it has none: records with
    #: images are then refused by name (never read as text)
    vision: dict[str, Any] | None = None
    #: `--media-dir`, resolved (None: image paths resolve against each input file's folder only)
    media_dir: str | None = None

    @cached_property
    def _by_path(self) -> dict[str, tuple[str, str, ShapeFields, bool]]:
        return {path: (fmt, shape, fields, loss) for path, fmt, shape, fields, loss in self.by_source}

    def for_chunk(self, chunk: Chunk) -> ChunkSettings:
        """The settings that read `chunk`: these, or its file's shape when the run's files have several (its
        `loss` then says whether that shape has targets; the store's is this run's `loss`)."""
        if not self.by_source:
            return self
        got = {self._by_path[path] for path in chunk.paths}
        if len(got) != 1:  # only .txt files share a chunk, and every one is text
            raise FormatError(f"chunk {chunk.index} joins files of {len(got)} record shapes, this is a bug")
        fmt, shape, fields, loss = got.pop()
        return replace(self, format=fmt, shape=shape, fields=fields, loss=loss, by_source=())

    @cached_property
    def reader(self) -> tuple[ShapeSpec, ShapeOptions]:
        """The shape's spec and the options its converter reads (looked up once per settings object)."""
        return shape_spec(self.shape), ShapeOptions(self.fields, self.role_map)

    def fingerprint(self) -> str:
        """sha256 of everything that changes the output bytes (not work_dir, not threads, not backend)."""
        data = asdict(self)
        for key in ("work_dir", "threads", "tokenizer_path", "backend"):
            data.pop(key)
        data["policy"].pop("manifest")
        if not self.by_source:  # the fingerprint of a run of one shape is what it was before per-file shapes
            data.pop("by_source")
        for key in ("vision", "media_dir"):  # nor that of a run without images
            if data[key] is None:
                data.pop(key)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def chunk_settings(config: TokenizeConfig, info: TokenizerInfo, output: Path, shape: Shape) -> ChunkSettings:
    """The settings of a run's chunks: its shape, fields and flags, the tokenizer's specials and template."""
    chat = shape.spec.chat
    template = info.chat_template
    if config.chat_template is not None:
        template = read_chat_template(config.chat_template)
    if chat and template:
        check_chat_template(
            template, config.chat_template or f"of tokenizer {info.name!r} ({info.chat_template_source})"
        )
    if chat and not template:
        raise ConfigError(
            f"{shape.spec.name} records are rendered by a chat template but tokenizer {info.name!r} has none "
            f"(neither chat_template.jinja nor tokenizer_config.json holds one), "
            + (info.chat_template_note or "pass --chat-template FILE")
        )
    media_dir = None
    if config.media_dir is not None:
        folder = Path(config.media_dir).expanduser()
        if not folder.is_dir():
            raise ConfigError(
                f"--media-dir {config.media_dir} is not a directory, pass the folder that holds the images"
            )
        media_dir = str(folder.resolve())
    policy = (
        pair_policy(info, shape, config) if shape.spec.pairs else special_policy(info, chat, config.bos, config.eos)
    )
    return ChunkSettings(
        tokenizer_path=info.path,
        tokenizer_sha256=info.sha256,
        format=shape.format.value,
        shape=shape.spec.name,
        fields=shape.fields,
        chat_template=template if chat else None,
        assistant_turns=str(config.assistant_turns),
        bos_token=info.bos_token,
        eos_token=info.eos_token,
        separator=config.separator,
        on_error=str(config.on_error),
        policy=policy,
        dtype=dtype_name(dtype_for_max_id(info.max_id)),
        work_dir=str(work_dir_for(output)),
        max_record_bytes=config.max_record_bytes,
        role_map=parse_role_map(config.role_map) if config.role_map else (),
        loss=shape.loss,
        media_dir=media_dir,
        by_source=tuple(
            (path, one.format.value, one.spec.name, one.fields, one.spec.loss) for path, one in shape.sources
        ),
    )


def pair_policy(info: TokenizerInfo, shape: Shape, config: TokenizeConfig) -> SpecialPolicy:
    """Preference pairs are tokenized as TRL 1.16's `DPOTrainer` does, nothing added or stripped by packtool:
    standard records through the tokenizer with its special tokens (its post-processor's BOS), the EOS text
    appended to each completion; conversational ones as `apply_chat_template(tokenize=True)`, no special
    tokens beyond what the template writes. So --bos/--eos and --assistant-turns last do not apply."""
    found = f"{shape.spec.name} records ({shape.where})"
    reads = {flag_of(f) for f in shape.spec.fields} | ({"role_map"} if shape.spec.role_map else set())
    for flag in shape_flags():  # `--format preference` reads six shapes: a flag for another one is no silent no-op
        if getattr(config, flag) is not None and flag not in reads:
            name = "--" + flag.replace("_", "-")
            raise UsageError(f"{name} does not apply to {found}, leave {name} out")
    for name, value in (("bos", config.bos), ("eos", config.eos)):
        if value is not None:
            flag = f"--{name}" if value else f"--no-{name}"
            raise UsageError(
                f"{flag} does not apply to preference pairs, {found}: their ids are TRL's DPOTrainer preprocessing "
                f"(the tokenizer's own special tokens, EOS on standard completions), leave {flag} out"
            )
    if AssistantTurns(str(config.assistant_turns)) == AssistantTurns.LAST:
        raise UsageError(
            f"--assistant-turns last does not apply to preference pairs, {found}: the targets are TRL's completion, "
            "leave --assistant-turns out"
        )
    if not shape.spec.chat and info.eos_token is None:
        raise ConfigError(
            f"standard preference records get the EOS text after each completion (TRL's DPOTrainer), but tokenizer "
            f"{info.name!r} defines no eos_token ({found}), use a tokenizer that has one"
        )
    standard = not shape.spec.chat
    post_bos, post_eos = info.post_bos and standard, info.post_eos and standard
    by = "TRL's DPOTrainer preprocessing (EOS text after each completion)" if standard else None
    return SpecialPolicy(
        add_special_tokens=standard,
        manifest={
            "bos": {
                "enabled": post_bos,
                "id": info.bos_id if post_bos else None,
                "by": "tokenizer post-processor" if post_bos else None,
            },
            "eos": {"enabled": standard or post_eos, "id": info.eos_id if standard or post_eos else None, "by": by},
        },
    )


def special_policy(info: TokenizerInfo, chat: bool, bos: bool | None, eos: bool | None) -> SpecialPolicy:
    """Resolve --bos/--eos against what the tokenizer's post-processor already does.

    text / prompt-completion run the post-processor (so ids equal `tokenizer.encode(text)`);
    chat (every shape rendered by the chat template) does not (the template writes its own specials, as `apply_chat_template` does).
    BOS is only prepended when asked (or kept when the post-processor adds it); EOS is
    appended by default when the tokenizer defines one, except for chat.
    """
    post_bos = info.post_bos and not chat
    post_eos = info.post_eos and not chat
    want_bos = post_bos if bos is None else bos
    want_eos = (info.eos_id is not None and not chat) or post_eos if eos is None else eos
    for flag, wanted, token_id in (("--bos", want_bos, info.bos_id), ("--eos", want_eos, info.eos_id)):
        if wanted and token_id is None:
            raise ConfigError(
                f"{flag} needs a {flag[2:]} token but tokenizer {info.name!r} defines none "
                f"(tokenizer_config.json {flag[2:]}_token), pass --no-{flag[2:]} or use a tokenizer that has one"
            )
    policy = SpecialPolicy(
        add_special_tokens=not chat,
        prepend=info.bos_id if want_bos and not post_bos else None,
        append=info.eos_id if want_eos and not post_eos else None,
        strip_first=info.bos_id if post_bos and not want_bos else None,
        strip_last=info.eos_id if post_eos and not want_eos else None,
        manifest={
            "bos": {
                "enabled": bool(want_bos),
                "id": info.bos_id if want_bos else None,
                "by": None if not want_bos else ("tokenizer post-processor" if post_bos else "packtool"),
            },
            "eos": {
                "enabled": bool(want_eos),
                "id": info.eos_id if want_eos else None,
                "by": None if not want_eos else ("tokenizer post-processor" if post_eos else "packtool"),
            },
        },
    )
    return policy
