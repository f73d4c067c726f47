"""The user-facing `TokenizeConfig` and the small picklable settings every chunk worker gets.

Every `TokenizeConfig` field is a CLI flag of `packtool tokenize` (dashes -> underscores) and a
key of the `tokenize` section of a `packtool run` YAML file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from packtool.config import InputFormat, OnError

DEFAULT_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class TokenizeConfig:
    """What to tokenize, with which tokenizer, into which token store."""

    inputs: tuple[str, ...]
    """Files, directories or globs of .jsonl, .jsonl.gz, .jsonl.zst, .parquet, .txt."""
    tokenizer: str
    """A tokenizer.json, a model directory holding one, or a hub name in the local HF cache."""
    output: str
    """The token store directory to create."""
    format: InputFormat = InputFormat.TEXT
    """text: every token is a target; prompt-completion: completion (+EOS); chat: assistant turns."""
    field: str = "text"
    """Dotted path of the text field (format text)."""
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    messages_field: str = "messages"
    chat_template: str | None = None
    """A Jinja file overriding the tokenizer's chat template."""
    separator: str | None = None
    """Split .txt files into documents at this string (default: one document per file)."""
    bos: bool | None = None
    """None follows the tokenizer (its post-processor decides); True/False force BOS on/off."""
    eos: bool | None = None
    """None appends EOS when the tokenizer defines one (text, prompt-completion); chat leaves it to the template."""
    workers: int | None = None
    """Parallel tokenizer threads/processes; None = all cores. Output bytes never depend on it."""
    on_error: OnError = OnError.FAIL
    """fail: stop at the first bad record (file:line); skip: log it to rejects.jsonl and go on."""
    overwrite: bool = False
    """Replace an existing, different token store at `output`."""
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """Size of a unit of work (and of resume); bigger chunks mean fewer, larger work files."""
    backend: str = "auto"
    """Tokenizer engine: hf (tokenizers), fast (fastokens), auto (fast when installed and verified identical)."""
    num_shards: int = 1
    """Split the chunk list into this many contiguous shards (one token store each; `packtool merge` joins them)."""
    shard_index: int = 0
    """Which shard this run writes (0-based)."""
    executor: str = "local"
    """Where chunks run: local (process pool) or ray."""
    ray_address: str | None = None
    """Ray cluster to join with --executor ray; None starts a local Ray with num_cpus = workers."""

    def resolved_workers(self) -> int:
        return max(1, self.workers if self.workers else (os.cpu_count() or 1))


@dataclass(frozen=True)
class SpecialPolicy:
    """How BOS/EOS are handled beyond the tokenizer's own post-processor."""

    add_special_tokens: bool  # run the tokenizer's post-processor (text, prompt-completion)
    prepend: int | None = None  # packtool prepends this id
    append: int | None = None  # packtool appends this id
    strip_first: int | None = None  # remove this id when the post-processor put it first (--no-bos)
    strip_last: int | None = None  # remove this id when the post-processor put it last (--no-eos)
    manifest: dict[str, Any] = field(default_factory=dict, compare=False)


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
    threads: int = 1
    backend: str = "hf"  # "hf" or "fast": the ids are identical (verified), so not in the fingerprint

    def fingerprint(self) -> str:
        """sha256 of everything that changes the output bytes (not work_dir, not threads, not backend)."""
        data = asdict(self)
        for key in ("work_dir", "threads", "tokenizer_path", "backend"):
            data.pop(key)
        data["policy"].pop("manifest")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
