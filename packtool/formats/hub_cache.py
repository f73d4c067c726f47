"""The local Hugging Face hub cache, read without `huggingface_hub` and without the network (what is not there is
fetched into it by `formats/hub_fetch.py`, for a `--tokenizer` repo and an `hf://datasets/...` input).

Layout: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`; a repo `org/name` is
`{models,datasets}--org--name/snapshots/<rev>/`, the current revision named by `refs/main` (another branch or
tag by `refs/<name>`; a commit hash names its snapshot directly). Every path read from the cache (a ref's
commit, a snapshot, a file) must stay inside the repo's directory (`formats.paths`, imported where it is used:
this module loads at every start, for the early `--tokenizer` lookup).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

_NOT_IN_REFS = frozenset(" ~^:?*[\\")
#: a ref file holds one commit hash (40 hex digits): more than this is not a ref
_REF_BYTES = 256
_HINT = "the cache entry is broken or was altered: delete the repo's directory from the hub cache and fetch it again"


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, honouring HF_HUB_CACHE and HF_HOME like huggingface_hub does."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def is_revision(text: str) -> bool:
    """A branch or tag name as git allows it (parts not empty, not starting with '.', no '..', no space or
    `~^:?*[\\`), or a commit hash: never a path such as `.`, `..` or `/abs`."""
    if not text or text.startswith("/") or text.endswith(("/", ".lock")) or ".." in text or "@{" in text:
        return False
    if any(ch in _NOT_IN_REFS or ord(ch) < 32 or ord(ch) == 127 for ch in text):
        return False
    return all(part and not part.startswith(".") for part in text.split("/"))


def hub_snapshot(repo_type: str, name: str, usable: Callable[[Path], bool], revision: str | None = None) -> Path | None:
    """The cached snapshot of `org/name` (a `models` or `datasets` repo): `refs/main`'s, else the newest usable.

    With `revision` (a branch or tag `huggingface_hub` recorded under `refs/`, or a commit hash), that snapshot
    or None: never another revision in its place. A ref whose content names a path outside `snapshots/` is an
    InputError naming it (`formats.paths`), never a snapshot."""
    from packtool.formats.paths import check_within

    repo = repo_dir(repo_type, name)
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    if revision is not None:
        if not is_revision(revision):
            return None  # a name, not a path out of the cache
        ref = repo / "refs" / revision
        if ref.is_file():
            candidate = _ref_snapshot(ref, repo)
        elif "/" in revision:
            return None  # a branch the cache did not record
        else:
            candidate = _snapshot(repo, revision, f"revision {revision!r}")
        return candidate if usable(candidate) else None
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = _ref_snapshot(ref, repo)
        if usable(candidate):
            return candidate
    found = sorted((p for p in snapshots.iterdir() if usable(p)), key=lambda p: p.stat().st_mtime)
    return check_within(found[-1], snapshots, "the newest snapshot", hint=_HINT) if found else None


def record_ref(repo_type: str, name: str, revision: str, commit: str) -> None:
    """`refs/REVISION` names `commit`, as huggingface_hub records a branch or tag it resolved (written whole:
    a temporary file renamed), so that the cache, `hf` and `datasets` find the snapshot offline by its name."""
    if not is_revision(revision) or not commit:
        return
    ref = repo_dir(repo_type, name) / "refs" / revision
    if ref.is_file() and ref.read_text(encoding="utf-8", errors="replace").strip() == commit:
        return
    _write_whole(ref, commit)


def _write_whole(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file renamed; best effort: a cache that cannot be written (read
    only, shared) keeps what it has, and the caller reads on without it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


#: beside `snapshots/` in a repo's cache directory (huggingface_hub reads only refs/, snapshots/ and blobs/)
LISTINGS = ".packtool"


def record_listing(repo_type: str, name: str, commit: str, files: list[str] | tuple[str, ...]) -> None:
    """The repo's file list at `commit` as the hub gave it, kept so that the cache alone resolves a selection
    exactly later (offline too): a snapshot holds only the files fetched."""
    import json

    if is_revision(commit) and "/" not in commit:
        _write_whole(repo_dir(repo_type, name) / LISTINGS / f"files-{commit}.json", json.dumps(sorted(files)))


def cached_listing(repo_type: str, name: str, commit: str) -> tuple[str, ...] | None:
    """The file list `record_listing` kept for `commit`, or None (none kept, or not a list of names)."""
    import json

    if not is_revision(commit) or "/" in commit:
        return None
    path = repo_dir(repo_type, name) / LISTINGS / f"files-{commit}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, list) or not all(isinstance(f, str) for f in data):
        return None
    return tuple(data)


def repo_dir(repo_type: str, name: str) -> Path:
    """The cache directory of repo `org/name` (`models` or `datasets`): every file of it lies inside."""
    return hub_cache_dir() / f"{repo_type}--{name.replace('/', '--')}"


def _ref_snapshot(ref: Path, repo: Path) -> Path:
    """The snapshot directory the commit in the ref file `ref` names (checked to be one inside `snapshots/`)."""
    from packtool.formats.oserrors import reading
    from packtool.formats.paths import check_within

    check_within(ref, repo / "refs", f"the ref file {ref.name!r}", hint=_HINT)
    with reading(ref), open(ref, "rb") as fh:
        data = fh.read(_REF_BYTES + 1)
    if len(data) > _REF_BYTES:  # not a ref: it was cut to 40 characters and another revision silently used
        from packtool.errors import InputError

        raise InputError(f"the ref file holds more than a commit hash (over {_REF_BYTES} bytes)", str(ref), hint=_HINT)
    commit = data.decode("utf-8", errors="replace").strip()
    return _snapshot(repo, commit, f"the ref file {ref}")


def _snapshot(repo: Path, commit: str, what: str) -> Path:
    from packtool.formats.paths import contained

    return contained(repo / "snapshots", commit, what, hint=_HINT, one_part=True)


def resolve_snapshot(name: str, needed: str, revision: str | None = None) -> Path | None:
    """The cached snapshot directory of model repo `org/name` (at `revision`, when given: that one or None)
    holding the file `needed`, or None.

    The file (in the cache, a link into the repo's `blobs/`) must lie inside the repo: `formats.paths`."""
    from packtool.formats.paths import check_within

    snapshot = hub_snapshot("models", name, lambda p: (p / needed).is_file(), revision)
    if snapshot is not None:
        check_within(snapshot / needed, repo_dir("models", name), f"the cached {needed} of {name}", hint=_HINT)
    return snapshot
