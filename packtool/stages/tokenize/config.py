"""`TokenizeConfig`: every flag of `packtool tokenize` (and key of a run config's `tokenize:` section).

`validate()` checks every value before any work starts (no input hashed, no directory created).
"""

from __future__ import annotations

from dataclasses import dataclass

from packtool.choices import AssistantTurns, BackendName, ExecutorName, InputFormat, OnError
from packtool.errors import UsageError
from packtool.stages.tokenize.inputs.record import DEFAULT_MAX_RECORD_BYTES

#: --chunk-bytes left out: the inputs' total size / AUTO_CHUNKS, between these bounds (`auto_chunk_bytes`)
MIN_CHUNK_BYTES = 1 << 20
DEFAULT_CHUNK_BYTES = 16 << 20
AUTO_CHUNKS = 64


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
    """text: every token is a target; prompt-completion: completion (+EOS); chat, sharegpt, alpaca (and TRL's
    conversational prompt-completion): assistant turns, through the chat template; auto: detected from the
    first records (docs/CHAT.md)."""
    field: str | None = None
    """text: dotted path of the text field (default `text`)."""
    prompt_field: str | None = None
    """prompt-completion: the prompt (default `prompt`; a list of messages: TRL's conversational shape)."""
    completion_field: str | None = None
    """prompt-completion: the completion, the target (default `completion`)."""
    messages_field: str | None = None
    """chat and openai: `messages`, sharegpt: `conversations` when left out (each shape's default: its spec)."""
    role_map: str | None = None
    """chat / sharegpt: `from=to,...` renaming roles to system/user/assistant/tool (extends sharegpt's default map)."""
    instruction_field: str | None = None
    """alpaca: the instruction (default `instruction`)."""
    input_field: str | None = None
    """alpaca: the optional input, joined to the instruction by a newline when not empty (default `input`)."""
    output_field: str | None = None
    """alpaca: the answer, the target (default `output`)."""
    history_field: str | None = None
    """alpaca: optional earlier [user, assistant] pairs (default `history`)."""
    system_field: str | None = None
    """alpaca / sharegpt: an optional system prompt string, the first message (default `system`)."""
    chat_template: str | None = None
    """A Jinja file overriding the tokenizer's chat template."""
    assistant_turns: AssistantTurns = AssistantTurns.ALL
    """chat: train on all assistant turns, or only the last one."""
    separator: str | None = None
    """Split .txt files into documents at this string (default: one document per file)."""
    media_dir: str | None = None
    """Records with images: the folder relative image paths resolve against (before the input file's own
    folder), and the only place an absolute image path, or a link, may lead (docs/VISION.md)."""
    bos: bool | None = None
    """None follows the tokenizer (its post-processor decides); True/False force BOS on/off."""
    eos: bool | None = None
    """None appends EOS when the tokenizer defines one (text, prompt-completion); chat leaves it to the template."""
    workers: int | None = None
    """Parallel tokenizer threads/processes; None = all cores, and never more than the cores (`resolved_workers`).
    Output bytes never depend on it."""
    on_error: OnError = OnError.FAIL
    """fail: stop at the first bad record (file:line); skip: log it to rejects.jsonl and go on."""
    overwrite: bool = False
    """Replace an existing, different token store at `output`."""
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    """Longest record (a jsonl line, a parquet row's text, a .txt document) in bytes; a longer one is a bad
    record (file:line; rejected with --on-error skip) and is never read whole into memory."""
    chunk_bytes: int | None = None
    """Size of a unit of work (and of resume). None: the inputs' total size / 64, between 1 MiB and 16 MiB
    (`auto_chunk_bytes`), so that a corpus of a few tens of MB still gives every worker many chunks. Chunks
    depend only on the inputs and this, never on the workers."""
    backend: BackendName = BackendName.AUTO
    """Tokenizer engine: hf (tokenizers), fast (fastokens), auto (fast when installed and verified identical)."""
    num_shards: int = 1
    """Split the chunk list into this many contiguous shards (one token store each; `packtool merge` joins them)."""
    shard_index: int = 0
    """Which shard this run writes (0-based)."""
    executor: ExecutorName = ExecutorName.LOCAL
    """Where chunks run: local (process pool) or ray."""
    ray_address: str | None = None
    """Ray cluster to join with --executor ray; None starts a local Ray with num_cpus = workers."""
    subset: str | None = None
    """hf://datasets/ORG/NAME inputs: the config (subset) to read, as `load_dataset(NAME, SUBSET)` names it."""
    split: str | None = None
    """hf://datasets/ORG/NAME inputs: the split to read (None: train), as `load_dataset(..., split=SPLIT)`."""

    def resolved_workers(self) -> int:
        """The workers (and Rust tokenizer threads) the run uses: `--workers`, capped at the machine's cores."""
        from packtool.exec import worker_count

        return worker_count(self.workers, self.executor, self.ray_address)

    def validate(self) -> TokenizeConfig:
        """Check every choice and range; returns self. A value outside its domain or flags that contradict each
        other are a UsageError (exit 2) naming the flag and the fix."""
        for name, enum_type in (
            ("format", InputFormat),
            ("on_error", OnError),
            ("backend", BackendName),
            ("executor", ExecutorName),
            ("assistant_turns", AssistantTurns),
        ):
            value = getattr(self, name)
            try:
                enum_type(str(value))
            except ValueError:
                choices = ", ".join(e.value for e in enum_type)
                raise UsageError(f"--{name.replace('_', '-')} {value!r} is not one of {choices}, pick one") from None
        self._check_shape_flags()
        if not self.inputs:
            raise UsageError("no inputs given, pass at least one file, directory or glob")
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"--workers must be >= 1, got {self.workers}, leave it out to use all cores")
        if self.max_record_bytes < 1:
            raise UsageError(
                f"--max-record-bytes must be >= 1, got {self.max_record_bytes}, leave it out for the default (16 MiB)"
            )
        if self.chunk_bytes is not None and self.chunk_bytes < 1:
            raise UsageError(f"--chunk-bytes must be >= 1, got {self.chunk_bytes}, leave it out for the default")
        if self.separator == "":
            raise UsageError(
                "--separator is empty, which would split nothing, pass the string between documents (e.g. "
                "--separator '\\n\\n') or leave it out for one document per .txt file"
            )
        if self.media_dir is not None and not self.media_dir:
            raise UsageError("--media-dir is empty, pass the folder that holds the images or leave it out")
        if self.num_shards < 1:
            raise UsageError(f"--num-shards must be at least 1, got {self.num_shards}, pass a positive count")
        if not 0 <= self.shard_index < self.num_shards:
            raise UsageError(
                f"--shard-index {self.shard_index} is outside 0..{self.num_shards - 1} for --num-shards "
                f"{self.num_shards}, pass an index below the shard count (Slurm: --shard-index $SLURM_ARRAY_TASK_ID)"
            )
        from packtool.exec import parse_executor

        parse_executor(self.executor, self.ray_address)
        self._check_hub_flags()
        return self

    def _check_hub_flags(self) -> None:
        """--subset / --split name a hub dataset's config and split: they need an hf://datasets/ORG/NAME input."""
        for flag, value in (("--subset", self.subset), ("--split", self.split)):
            if value is None:
                continue
            if not str(value).strip():
                raise UsageError(f"{flag} is empty, pass a name or leave {flag} out")
            if not any(str(i).startswith("hf://datasets/") for i in self.inputs):
                raise UsageError(
                    f"{flag} {value!r} applies to hub datasets only and no input is one, "
                    f"name one (hf://datasets/ORG/NAME) or leave {flag} out"
                )

    def _check_shape_flags(self) -> None:
        """Flags that the format does not read are contradictions, not silent no-ops (the shapes' specs say).

        The shapes are imported here, not with the module: `packtool --help` imports this config."""
        from packtool.core.encoding.shapes.registry import flags_read, formats_reading, has_turns, shape_flags
        from packtool.core.encoding.shapes.roles import parse_role_map

        fmt = str(self.format)
        reads = flags_read(fmt)
        for name in shape_flags():
            if getattr(self, name) is not None and name not in reads:
                flag = "--" + name.replace("_", "-")
                raise UsageError(
                    f"{flag} does not apply to --format {fmt} (it is for {', '.join(formats_reading(name))}), "
                    f"leave {flag} out or pick the format that has it"
                )
        if AssistantTurns(str(self.assistant_turns)) == AssistantTurns.LAST and not has_turns(fmt):
            raise UsageError(
                f"--assistant-turns last does not apply to --format {fmt} (it is for records with assistant turns), "
                "leave --assistant-turns out or pick the format of the records"
            )
        if self.chat_template is not None and not has_turns(fmt):
            raise UsageError(
                f"--chat-template does not apply to --format {fmt} (no chat template renders its records), "
                "leave --chat-template out or pick the format of the records (chat, sharegpt, ...)"
            )
        if self.media_dir is not None and not has_turns(fmt):
            raise UsageError(
                f"--media-dir does not apply to --format {fmt} (its records hold no images), "
                "leave --media-dir out or pick the format of the records (chat, sharegpt, ...)"
            )
        if self.role_map is not None:
            try:
                parse_role_map(self.role_map)
            except ValueError as exc:
                raise UsageError(f"--role-map {self.role_map!r} is malformed: {exc}") from None


def auto_chunk_bytes(total_bytes: int) -> int:
    """The chunk size for inputs of `total_bytes` when --chunk-bytes is left out.

    16 MiB chunks cut a 21 MB chat corpus into two unequal chunks: one of two workers did three quarters
    of the run (1.8-2.0 s against 1.5-1.7 s with 1 MiB chunks, `packtool tokenize --backend fast`, 10.9 M
    tokens, 2 cores). A sixty-fourth of the input keeps every worker busy to the end on small corpora,
    and large ones keep 16 MiB chunks (fewer journal entries, larger encode batches).
    """
    return max(MIN_CHUNK_BYTES, min(DEFAULT_CHUNK_BYTES, total_bytes // AUTO_CHUNKS))
