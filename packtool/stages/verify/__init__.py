"""The verify stage (read-only): every invariant and checksum of a token store or a pack store.

A store that opens is not yet a store that is right: hashes only prove the bytes are the ones the
writer hashed. Verify re-derives what the bytes must satisfy (ids below the tokenizer's bound,
padding where padding belongs, metadata counts equal to the arrays) and, with `--source`, that the
packs hold every source document exactly once with identical tokens and loss bits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_store import (
    find_pack_dir,
    metadata_name,
    open_pack_split,
    parse_data_name,
    read_metadata,
    sizes_in,
)
from packtool.formats.token_store import MANIFEST
from packtool.progress import Progress
from packtool.stages.verify.packs import verify_pack_split
from packtool.stages.verify.tokens import verify_token_store

__all__ = ["VerifyConfig", "VerifyReport", "verify_pack_split", "verify_path", "verify_token_store"]


@dataclass(frozen=True)
class VerifyConfig:
    """Everything `packtool verify` needs; `verify_path(config)` is the library call."""

    path: Path
    """A token store or a pack store (ROOT, `packed/{tok}` dir or `.npy` file)."""
    source: Path | None = None
    """The token store a pack store was made from: check every document's tokens round-trip."""


@dataclass(frozen=True)
class VerifyReport:
    """What was checked; returned only when every check passed."""

    kind: str  # "tokens" or "packs"
    path: str
    checked: list[str] = field(default_factory=list)  # one line per token store / split checked
    source: str | None = None
    n_bytes: int = 0  # bytes of array data checked (hashes included)

    def to_text(self) -> str:
        src = f"; every document of {self.source} round-trips" if self.source else ""
        return f"{self.kind} store {self.path}: " + "; ".join(self.checked) + src


def _splits(path: Path, directory: Path) -> list[tuple[str, int]]:
    """(split, size) pairs to check: the one a `.npy` names, else every line of every `{N}_metadata.jsonl`."""
    if path.is_file():
        named = parse_data_name(path.name)
        if named is None:
            raise FormatError(
                f"{path.name} is not a pack file name ({{split}}_{{N}}.npy), {path}, pass a pack store directory"
            )
        return [named]
    pairs = [(str(rec["split"]), size) for size in sizes_in(directory) for rec in read_metadata(directory, size)]
    if not pairs:
        raise FormatError(f"no split in any *_metadata.jsonl, {directory}, run `packtool pack`")
    return pairs


def verify_path(config: VerifyConfig, progress: Progress | None = None) -> VerifyReport:
    """Verify a token store (a directory with manifest.json) or a pack store; raise FormatError at the first failure."""
    path = Path(config.path)
    if path.is_dir() and (path / MANIFEST).is_file():
        if config.source is not None:
            raise ConfigError(f"--source applies to a pack store, {path} is a token store, leave --source out")
        _, line = verify_token_store(path, progress)
        return VerifyReport("token", str(path), [line], n_bytes=_store_bytes(path))
    directory = find_pack_dir(path)
    store = None
    if config.source is not None:
        store, _ = verify_token_store(Path(config.source))
        manifest_sha = store.manifest_sha256
    lines = []
    for split, size in _splits(path, directory):
        ps = open_pack_split(directory, split, size, check_hashes=True)
        if store is not None:
            recorded = (ps.metadata.get("source") or {}).get("manifest_sha256")
            if recorded != manifest_sha:
                raise FormatError(
                    f"packs were made from another token store: {split}_{size} records source manifest sha256 "
                    f"{str(recorded)[:12]}..., {store.path / MANIFEST} has {manifest_sha[:12]}..., "
                    f"{directory / metadata_name(size)}, pass the right --source or re-run `packtool pack` on it"
                )
        lines.append(verify_pack_split(ps, store, progress))
    n_bytes = sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
    return VerifyReport("pack", str(directory), lines, None if store is None else str(store.path), n_bytes)


def _store_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
