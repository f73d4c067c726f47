"""Hub datasets: `hf://datasets/ORG/NAME[@REVISION][/PATH]`, read from the Hugging Face hub cache, what is
missing fetched into it first (`formats/hub_fetch.py`: huggingface_hub, `HF_ENDPOINT`, `HF_TOKEN`).

Without PATH, `--subset` / `--split` pick the files as `load_dataset(NAME, SUBSET, split=SPLIT)` does
(`hub_select.py`; the split left out is `train`). With PATH (a file, a directory or a glob inside the repo)
exactly what it names is read, and `--subset` / `--split` do not apply.

The cache first: when it holds a snapshot of the revision (`refs/main`, `refs/REVISION`, or a commit) in which
the selection resolves over the file list packtool kept when it fetched it, it is read without asking the hub,
as a tokenizer is. A snapshot packtool did not fill (`hf download --include` may have fetched part of a split)
is read as is only offline, with every shard a `-NNNNN-of-NNNNN` name counts, and `cache_trusted` on record
(a PATH: all the files the kept list names under it, else, online, the hub's list).
`@REVISION` pins another commit. Otherwise the hub names the revision's commit and its files, and only the selection's files (and the card, `README.md`, which its `configs:` need) are fetched, at
that commit, into `snapshots/<commit>/`, the branch recorded under `refs/` as huggingface_hub does: `hf` and
`datasets` find them there. `HF_HUB_OFFLINE=1` reads the cache only. A repo that holds a loading script
(`NAME.py`, which datasets no longer runs) or no data files is read from the hub's Parquet export, the
`refs/convert/parquet` branch. Every path read must stay inside the snapshot, as its files' links must stay
inside the repo (`formats.paths`). Each hub input is recorded (`HubOptions.resolved`: the repo, revision,
commit, subset, split) for the store's manifest.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import unquote

from packtool.errors import InputError
from packtool.formats.hub_cache import (
    cached_listing,
    hub_cache_dir,
    hub_snapshot,
    is_revision,
    record_listing,
    repo_dir,
)
from packtool.formats.hub_fetch import failure_text, fetch_files, offline, repo_revision
from packtool.formats.paths import contained
from packtool.progress import Progress
from packtool.stages.tokenize.inputs.locators.base import Found, plain
from packtool.stages.tokenize.inputs.locators.files import expand_dir, expand_glob, kinds_text
from packtool.stages.tokenize.inputs.locators.hub_select import CONVERT_BRANCH, Selected, select
from packtool.stages.tokenize.inputs.locators.saved import INFO, STATE, dataset, is_saved_dataset
from packtool.stages.tokenize.inputs.readers.registry import reader_for

PREFIX = "hf://"
README = "README.md"
_SHARD = re.compile(r"^(?P<head>.*)-(?P<index>[0-9]{5})-of-(?P<total>[0-9]{5})(?P<tail>[^/]*)$")


@dataclass
class HubOptions:
    """What a run says about its `hf://datasets/...` inputs, and what they resolved to."""

    subset: str | None = None
    split: str | None = None
    progress: Progress | None = None
    resolved: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class HubRef:
    """`hf://datasets/ORG/NAME[@REVISION][/PATH]`, parsed."""

    name: str
    revision: str | None
    inner: str
    given: str


class HubLocator:
    name: str = "hub"

    def __init__(self, options: HubOptions | None = None) -> None:
        self.options = options or HubOptions()

    def claims(self, text: str) -> bool:
        return text.startswith(PREFIX)

    def locate(self, text: str) -> Found:
        """The data files the argument names (see the module docstring), fetched first when missing."""
        ref = parse(text)
        opts = self.options
        if ref.inner and (opts.subset is not None or opts.split is not None):
            flag = "--subset" if opts.subset is not None else "--split"
            raise InputError(
                f"{flag} does not apply to a hub path: {ref.inner!r} names the files to read",
                text,
                hint=f"leave {flag} out, or name the dataset alone: hf://datasets/{ref.name}",
            )
        if ref.inner:
            return self._path(ref)
        cached = _cached(ref, opts)
        if cached is not None:
            return self._found(ref, *cached)
        if offline():
            _offline_error(ref, opts)
        return self._found(ref, *self._fetch(ref))

    def _fetch(self, ref: HubRef) -> tuple[Path, Selected, str]:
        opts = self.options
        revision = ref.revision
        remote = _ask(ref, lambda: repo_revision("dataset", ref.name, revision))
        record_listing("datasets", ref.name, remote.commit, remote.files)
        files, converted = remote.files, revision == CONVERT_BRANCH
        readme = self._readme(ref, revision, remote.commit, files)
        script = f"{ref.name.split('/')[-1]}.py"
        if not converted and (script in files or not _has_data(files, readme, ref)):
            why = f"holds a loading script ({script})" if script in files else "holds no data files datasets reads"
            revision = CONVERT_BRANCH
            remote = _ask(ref, lambda: repo_revision("dataset", ref.name, CONVERT_BRANCH), f"it {why}, and ")
            record_listing("datasets", ref.name, remote.commit, remote.files)
            files, converted, readme = remote.files, True, None
        chosen = select(files, readme, opts.subset, opts.split, ref.name, ref.given, converted)
        wanted = [*chosen.files, *_side_files(chosen.files, files)]
        snapshot = _ask(
            ref, lambda: fetch_files("dataset", ref.name, revision or "main", remote.commit, wanted, opts.progress)
        )
        return snapshot, chosen, revision or "main"

    def _readme(self, ref: HubRef, revision: str | None, commit: str, files: tuple[str, ...]) -> str | None:
        if README not in files:
            return None
        snapshot = _ask(ref, lambda: fetch_files("dataset", ref.name, revision or "main", commit, [README]))
        return (snapshot / README).read_text(encoding="utf-8", errors="replace")

    def _found(self, ref: HubRef, snapshot: Path, chosen: Selected, revision: str) -> Found:
        within = repo_dir("datasets", ref.name).resolve()
        out: Found = {}
        for i, rel in enumerate(chosen.files):
            path = contained(snapshot.resolve(), rel, f"a file of {ref.name}", hint=_HINT, links_within=within)
            if is_saved_dataset(path.parent):
                out.update(dataset(path.parent, str(path.parent), within))
            else:  # in the selection's order (datasets'), at the snapshot's place among the other inputs
                out.update({file: (str(snapshot.resolve()), i) for file in plain(path)})
        entry: dict[str, Any] = {
            "dataset": ref.name,
            "revision": revision,
            "commit": snapshot.name,
            "subset": chosen.subset,
            "split": chosen.split,
            "files": len(chosen.files),
        }
        if cached_listing("datasets", ref.name, snapshot.name) is None:  # offline, a cache packtool did not fill
            entry["cache_trusted"] = True  # its files were taken as the whole selection, unchecked against the hub
        self.options.resolved.append(entry)
        return out

    def _path(self, ref: HubRef) -> Found:
        """`hf://datasets/ORG/NAME[@REV]/PATH`: the cached snapshot's files PATH names, when it holds all those the
        repo's listing names there (offline, or with no listing kept, online the hub is asked); else fetched."""
        snapshot = hub_snapshot("datasets", ref.name, Path.is_dir, ref.revision)
        if snapshot is not None and (offline() or _holds_path(ref, snapshot)):
            found = _in_snapshot(ref, snapshot.resolve(), quiet=not offline())
            if found:
                return found
        if offline():
            if snapshot is not None:
                _in_snapshot(ref, snapshot.resolve(), quiet=False)  # the error naming what the cache holds
            _not_cached(ref)
        remote = _ask(ref, lambda: repo_revision("dataset", ref.name, ref.revision))
        record_listing("datasets", ref.name, remote.commit, remote.files)
        inner, wanted = ref.inner.strip("/"), _path_files(ref, remote.files)
        if not wanted:
            raise InputError(
                f"dataset {ref.name} holds no {kinds_text()} at {inner!r}",
                ref.given,
                hint="name a data file, directory or glob inside it: hf://datasets/ORG/NAME/PATH",
            )
        snapshot = _ask(
            ref,
            lambda: fetch_files(
                "dataset", ref.name, ref.revision or "main", remote.commit, wanted, self.options.progress
            ),  # fmt: skip
        )
        found = _in_snapshot(ref, snapshot.resolve(), quiet=False)
        self.options.resolved.append(
            {"dataset": ref.name, "revision": ref.revision or "main", "commit": snapshot.name, "path": inner}
        )
        return found


_HINT = "the cache entry is broken or was altered: delete the repo's directory from the hub cache and fetch it again"


def parse(text: str) -> HubRef:
    """`hf://datasets/ORG/NAME[@REVISION][/PATH]` -> its parts; REVISION a branch, tag or commit name."""
    parts = text[len(PREFIX) :].strip("/").split("/")
    repo, at, revision = parts[2].partition("@") if len(parts) > 2 else ("", "", "")
    if len(parts) < 3 or parts[0] != "datasets" or not parts[1] or not repo or (at and not revision):
        raise InputError(
            "not a hub dataset name (expected hf://datasets/ORG/NAME, optionally @REVISION and a path or glob)",
            text,
            hint="write hf://datasets/ORG/NAME[@REVISION][/PATH]",
        )
    name = f"{parts[1]}/{repo}"
    inner = "/".join(parts[3:])
    revision = unquote(revision)  # `refs%2Fconvert%2Fparquet`, as HfFileSystem writes it
    if revision == "refs" and len(parts) >= 5:  # refs/convert/parquet, refs/pr/N: a revision with slashes
        revision, inner = "/".join(["refs", parts[3], parts[4]]), "/".join(parts[5:])
    if at and not is_revision(revision):
        raise InputError(
            f"dataset {name} at revision {revision!r} is not in the local Hugging Face cache: a revision is a "
            "branch, tag or commit name, not a path",
            text,
            hint="write hf://datasets/ORG/NAME@REVISION with a branch, tag or commit hash the cache holds",
        )
    return HubRef(name, revision or None, inner, text)


def glob_match(pattern: str) -> re.Pattern[str]:
    from packtool.stages.tokenize.inputs.locators.hub_select import glob_regex

    return glob_regex(pattern)


def _ask(ref: HubRef, call: Any, why: str = "") -> Any:
    """A hub call; what it raises becomes one InputError line naming the dataset."""
    try:
        return call()
    except InputError:
        raise
    except Exception as exc:  # a refused token, an absent repo, a dead link: one line, never a trace
        revision = CONVERT_BRANCH if why else ref.revision
        text = failure_text("dataset", ref.name, revision, exc)
        if why:
            text = f"dataset {ref.name} is read from the hub's Parquet export because {why}{text}"
        raise InputError(text, ref.given) from exc


def _path_files(ref: HubRef, files: tuple[str, ...]) -> list[str]:
    """The files of the repo's listing that PATH names (a file, a directory's files, a glob's matches)."""
    inner = ref.inner.strip("/")
    rx = glob_match(inner)
    wanted = [f for f in files if f == inner or f.startswith(inner + "/") or rx.match(f)]
    return [f for f in wanted if reader_for(Path(f)) or Path(f).name in (STATE, INFO)]


def _holds_path(ref: HubRef, snapshot: Path) -> bool:
    """The snapshot holds every file PATH names in the listing packtool kept for it (False: no listing kept,
    the snapshot may hold part of a directory `hf download --include` fetched in part)."""
    listing = cached_listing("datasets", ref.name, snapshot.name)
    if listing is None:
        return False
    held = set(_listing(snapshot))
    return all(f in held for f in _path_files(ref, listing))


def _has_data(files: tuple[str, ...], readme: str | None, ref: HubRef) -> bool:
    from packtool.stages.tokenize.inputs.locators.hub_select import default_splits, read_card_configs

    return bool(read_card_configs(readme, ref.given)) or bool(default_splits(files))


def _side_files(chosen: tuple[str, ...], files: tuple[str, ...]) -> list[str]:
    """A `save_to_disk` directory's state.json and dataset_info.json beside its selected Arrow files."""
    have = set(files)
    dirs = {f.rsplit("/", 1)[0] if "/" in f else "" for f in chosen}
    side = [f"{d}/{n}" if d else n for d in sorted(dirs) for n in (STATE, INFO)]
    return [f for f in side if f in have and f not in chosen]


def _cached(ref: HubRef, opts: HubOptions) -> tuple[Path, Selected, str] | None:
    """The selection from a cached snapshot of the revision, when it resolves there whole; else None.

    A script dataset's own snapshot (its card and script) sends the default revision to its cached export."""
    snapshot = hub_snapshot("datasets", ref.name, Path.is_dir, ref.revision)
    converted = ref.revision == CONVERT_BRANCH
    if snapshot is not None and not converted and ref.revision in (None, "main"):
        listing = cached_listing("datasets", ref.name, snapshot.name) or tuple(_listing(snapshot))
        if f"{ref.name.split('/')[-1]}.py" in listing:
            snapshot, converted = hub_snapshot("datasets", ref.name, Path.is_dir, CONVERT_BRANCH), True
    if snapshot is None:
        return None
    try:
        chosen = _cached_select(ref, opts, snapshot, converted)
    except InputError:
        return None
    return None if chosen is None else (snapshot, chosen, CONVERT_BRANCH if converted else ref.revision or "main")


def _cached_select(ref: HubRef, opts: HubOptions, snapshot: Path, converted: bool) -> Selected | None:
    """The selection over the repo's listing kept for the snapshot's commit (else, offline only, over the files
    the snapshot holds); None when some of the files it names are not in the snapshot, or when packtool kept no
    listing and the hub can be asked: `hf download --include` may have fetched only some of a split's files,
    and nothing in the cache says so. InputError: it does not resolve."""
    listing = cached_listing("datasets", ref.name, snapshot.name)
    if listing is None and not offline():
        return None
    held = tuple(sorted(_listing(snapshot)))
    readme = (snapshot / README).read_text(encoding="utf-8", errors="replace") if README in held else None
    if listing is not None and README in listing and readme is None:
        return None
    chosen = select(listing or held, readme, opts.subset, opts.split, ref.name, ref.given, converted)
    have = set(held)
    if not all(f in have for f in chosen.files) or (listing is None and not _complete(chosen.files)):
        return None
    return chosen


def _listing(snapshot: Path) -> list[str]:
    out = []
    for path in snapshot.rglob("*"):
        rel = path.relative_to(snapshot).as_posix()
        if path.is_file() or path.is_symlink():
            out.append(rel)
    return out


def _complete(files: tuple[str, ...]) -> bool:
    """Every `NAME-NNNNN-of-MMMMM` family holds its MMMMM shards (a partial cache is never read as the split)."""
    families: dict[tuple[str, str, str], set[str]] = {}
    for f in files:
        m = _SHARD.match(f)
        if m:
            families.setdefault((m["head"], m["total"], m["tail"].rsplit(".", 1)[-1]), set()).add(m["index"])
    return all(len(got) == int(total) for (_, total, _), got in families.items())


def _offline_error(ref: HubRef, opts: HubOptions) -> NoReturn:
    snapshot = hub_snapshot("datasets", ref.name, Path.is_dir, ref.revision)
    if snapshot is not None:
        try:
            if _cached_select(ref, opts, snapshot, ref.revision == CONVERT_BRANCH) is None:
                _not_cached(ref, " (its cached snapshot holds only some of the files the selection reads)")
        except InputError as exc:  # the cache answers: the split or subset is not there
            raise InputError(
                f"{exc.reason} (HF_HUB_OFFLINE is set: the cached snapshot {snapshot.name[:12]} was read)",
                ref.given,
                hint=exc.hint,
            ) from None
    _not_cached(ref)


def _not_cached(ref: HubRef, why: str = "") -> NoReturn:
    what = f"dataset {ref.name}" + (f" at revision {ref.revision!r}" if ref.revision else "")
    fetch = f"hf download {ref.name} --repo-type dataset" + (f" --revision {ref.revision}" if ref.revision else "")
    raise InputError(
        f"{what} is not in the local Hugging Face cache ({hub_cache_dir()}){why} and HF_HUB_OFFLINE is set",
        ref.given,
        hint=f"unset HF_HUB_OFFLINE to fetch it, or fetch it with `{fetch}`, or set HF_HUB_CACHE / HF_HOME",
    )


def _in_snapshot(ref: HubRef, snapshot: Path, quiet: bool) -> Found:
    """The files PATH names inside a snapshot; with `quiet`, {} instead of an error when it names none."""
    within = repo_dir("datasets", ref.name).resolve()
    target = contained(
        snapshot,
        ref.inner,
        f"the path after hf://datasets/{ref.name}",
        hint="name a data file, directory or glob inside the dataset: hf://datasets/ORG/NAME/PATH",
        links_within=within,
    )
    if target.is_dir():
        out = dataset(target, ref.given, within) if is_saved_dataset(target) else expand_dir(target, within)
    elif target.is_file():
        out = plain(target) if reader_for(target) else {}
    elif glob.has_magic(str(target)):
        out = expand_glob(str(target), within)
    else:
        out = {}
    if not out and not quiet:
        raise InputError(
            f"dataset {ref.name} in the hub cache ({snapshot}) holds no {kinds_text()} at {ref.inner!r}",
            ref.given,
            hint="name a data file, directory or glob inside it: hf://datasets/ORG/NAME/PATH",
        )
    return out
