"""`ChunkSettings`, the small picklable settings every chunk task gets, and how BOS/EOS are resolved."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from packtool.choices import InputFormat
from packtool.core.encoding.encode import SpecialPolicy
from packtool.errors import ConfigError
from packtool.stages.tokenize.streams import DEFAULT_MAX_RECORD_BYTES
from packtool.stages.tokenize.tokenizer import TokenizerInfo


@dataclass(frozen=True)
class ChunkSettings:
    """Everything `tokenize_chunk` needs besides the chunk: picklable, and hashed into resume keys."""

    tokenizer_path: str
    tokenizer_sha256: str
    format: str
    field: str
    prompt_field: str
    completion_field: str
    messages_field: str
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
    assistant_turns: str = "all"  # chat: "all" or "last" assistant turns are targets
    conversational: bool = False  # prompt-completion: TRL's lists of messages (the chat path)
    role_map: tuple[tuple[str, str], ...] = ()  # chat / sharegpt: --role-map pairs
    instruction_field: str = "instruction"  # alpaca fields
    input_field: str = "input"
    output_field: str = "output"
    history_field: str = "history"
    system_field: str = "system"  # alpaca and sharegpt

    @property
    def chat(self) -> bool:
        """Records become messages rendered by the chat template (chat, sharegpt, alpaca, TRL conversational)."""
        return renders_chat(self.format, self.conversational)

    def fingerprint(self) -> str:
        """sha256 of everything that changes the output bytes (not work_dir, not threads, not backend)."""
        data = asdict(self)
        for key in ("work_dir", "threads", "tokenizer_path", "backend"):
            data.pop(key)
        data["policy"].pop("manifest")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def renders_chat(fmt: str, conversational: bool = False) -> bool:
    """Whether a (resolved) format goes through the chat template."""
    return fmt in (InputFormat.CHAT, InputFormat.SHAREGPT, InputFormat.ALPACA) or (
        fmt == InputFormat.PROMPT_COMPLETION and conversational
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
