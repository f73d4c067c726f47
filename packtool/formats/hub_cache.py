"""The local Hugging Face hub cache, read without `huggingface_hub` and without the network.

Layout: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`; a repo `org/name` is
`{models,datasets}--org--name/snapshots/<rev>/`, the current revision named by `refs/main` (another branch or
tag by `refs/<name>`; a commit hash names its snapshot directly).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, honouring HF_HUB_CACHE and HF_HOME like huggingface_hub does."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def hub_snapshot(repo_type: str, name: str, usable: Callable[[Path], bool], revision: str | None = None) -> Path | None:
    """The cached snapshot of `org/name` (a `models` or `datasets` repo): `refs/main`'s, else the newest usable.

    With `revision` (a branch or tag `huggingface_hub` recorded under `refs/`, or a commit hash), that snapshot
    or None: never another revision in its place."""
    repo = hub_cache_dir() / f"{repo_type}--{name.replace('/', '--')}"
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    if revision is not None:
        if ".." in revision.split("/") or revision.startswith("/"):
            return None  # a name, not a path out of the cache
        ref = repo / "refs" / revision
        commit = ref.read_text().strip() if ref.is_file() else revision
        candidate = snapshots / commit
        return candidate if commit and "/" not in commit and usable(candidate) else None
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text().strip()
        if usable(candidate):
            return candidate
    found = sorted((p for p in snapshots.iterdir() if usable(p)), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def resolve_snapshot(name: str, needed: str) -> Path | None:
    """The cached snapshot directory of model repo `org/name` holding the file `needed`, or None."""
    return hub_snapshot("models", name, lambda p: (p / needed).is_file())
