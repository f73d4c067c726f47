"""The export stage's records: the target choice, the validated config, the job an exporter gets, its result."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.choices import ExportTarget
from packtool.errors import ConfigError
from packtool.formats.exports import StagedExport
from packtool.formats.pack_store import PackSplit
from packtool.progress import Progress


@dataclass(frozen=True)
class ExportConfig:
    """What `packtool export` was asked to do."""

    path: str | os.PathLike[str]
    """A pack store: a `packed/{tokenizer}` directory, a pack ROOT holding one tokenizer, or a `{S}_{N}.npy` file."""
    to: ExportTarget | str
    """The trainer format to write (`ExportTarget`)."""
    output: str | os.PathLike[str]
    """Directory that receives the files (created; never the pack directory itself)."""
    split: str = "training"
    """Split to export (a `{S}_{N}.npy` path fixes it)."""
    size: int | None = None
    """Pack size N; may be left out when the store holds one size only (a `{S}_{N}.npy` path fixes it)."""
    eos_id: int | None = None
    """EOS token id; default: the source token store's manifest (needed by megatron-bridge, nemo, olmo-core)."""
    overwrite: bool = False
    """Replace this export's files when they exist already (other files in the directory are kept)."""

    @property
    def target(self) -> ExportTarget:
        try:
            return ExportTarget(str(self.to))
        except ValueError:
            choices = ", ".join(t.value for t in ExportTarget)
            raise ConfigError(f"unknown export target {str(self.to)!r}, --to, use one of {choices}") from None

    def validate(self) -> ExportConfig:
        """Check every choice and range before any work; returns self so callers can chain."""
        _ = self.target
        if self.size is not None and self.size < 1:
            raise ConfigError(f"--size must be a positive number of tokens, got {self.size}, pass the packed size N")
        if self.eos_id is not None and self.eos_id < 0:
            raise ConfigError(f"--eos-id must be >= 0, got {self.eos_id}, pass the tokenizer's EOS id")
        return self


@dataclass(frozen=True)
class TokenizerIds:
    """Token ids an export needs, from the pack metadata and the source token store's manifest."""

    pad_id: int
    eos_id: int | None
    vocab_size: int | None


@dataclass(frozen=True)
class ExportResult:
    """What `export_store` wrote, and what to put in the trainer's config to read it."""

    target: ExportTarget
    directory: Path
    files: tuple[Path, ...]
    n_packs: int
    size: int
    lines: tuple[str, ...]
    """Trainer config lines and the numbers it needs (the CLI prints them)."""
    numbers: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportJob:
    """Everything an exporter gets: the opened split, the ids, where to write, how to report progress."""

    store: PackSplit
    ids: TokenizerIds
    staged: StagedExport
    directory: Path
    progress: Progress | None
