"""The export stage's records: the validated config, the contract an exporter implements, its job and result.

`Exporter` is the one contract of a trainer export: every module under `stages/export/` for a
target builds one (`EXPORTER = Exporter(...)`) and `registry.EXPORTERS` lists them; nothing else
names a target (a guard test ties the registry to `choices.ExportTarget`, the `--to` choices).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.choices import ExportTarget
from packtool.errors import UsageError
from packtool.formats.exports import StagedExport
from packtool.formats.pack_store import PackSplit
from packtool.progress import Progress

_FIX = {"--size": "pass the packed size N", "--eos-id": "pass the tokenizer's EOS id"}


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
            raise UsageError(f"unknown export target {str(self.to)!r}, --to, use one of {choices}") from None

    def validate(self) -> ExportConfig:
        """Check every choice and range before any work; returns self so callers can chain."""
        _ = self.target
        for flag, value, low in (("--size", self.size, 1), ("--eos-id", self.eos_id, 0)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise UsageError(f"{flag} must be an integer >= {low}, got {value!r}, {_FIX[flag]}")
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


FileNames = Callable[[str, int], "tuple[list[str], list[str]]"]
"""`(split, size) -> (per-split files, files shared by every split of that size)`, in `formats.exports` names."""
Check = Callable[[PackSplit, TokenizerIds], None]
"""Refuse (ConfigError with the fix) what the trainer cannot represent, before anything is written."""
Write = Callable[[ExportJob], "tuple[list[str], dict[str, Any]]"]
"""Write every file of `file_names` through `job.staged`; return the trainer config lines and numbers."""


@dataclass(frozen=True)
class Exporter:
    """One trainer format: the contract each `stages/export/<target>.py` module fills in as `EXPORTER`."""

    target: ExportTarget
    """The `--to` value that selects it."""
    files: str
    """The files it writes, in words (`{S}` split, `{N}` size): docs and the CLI's listing."""
    reader: str
    """The trainer's own reader of those files (what `tests/interop` runs)."""
    file_names: FileNames
    check: Check
    write: Write
    preference_layouts: tuple[str, ...] = ()
    """Preference pack layouts (`formats.pack_store.PAIR_LAYOUTS`) whose files its trainer reads exactly; a
    preference pack store of any other layout is refused by `export_store` before `check` runs (a trainer
    without a pair format would read the pairs as unrelated SFT sequences, and a shared prompt not at all)."""
    preference_recipe: Callable[[Path, int], list[str]] | None = None
    """A trainer that reads preference pack stores themselves (no files to write): the lines that say how, for
    the pack directory and size. `export_store` then writes nothing and returns these lines, for every layout."""
