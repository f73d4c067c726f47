"""Datasets in the local Hugging Face hub cache: `hf://datasets/ORG/NAME[@REVISION][/PATH]`.

Only the cache on disk is read (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
`~/.cache/huggingface/hub`; layout `{models,datasets}--ORG--NAME/snapshots/<rev>/`, revision
from `refs/main`, or `hf://datasets/ORG/NAME@REVISION` for a branch or tag under `refs/` or a commit
hash), so nothing ever needs the network nor `huggingface_hub`. A dataset that is
not there is an error that names the command fetching it.

Which files of a dataset snapshot are data, when no PATH narrows it: the files of the readable
kinds (and `save_to_disk` directories), hidden paths and metadata left out as in any directory;
of those, the most common hub file family (each reader names its family and the rank a tie
prefers: parquet, arrow, json/jsonl, txt), as `datasets` picks the most common extension; and when
their names carry split names the way the hub names them (`train`, `validation`/`valid`/`dev`/`val`,
`test`/`eval`), the `train` split only (files named for splits with no `train` among them are an
error naming them). A PATH (a file, a directory, or a glob inside the snapshot) takes exactly what it
names, and must stay inside the snapshot, as its files' links must stay inside the repo
(`formats.paths`).
"""

from __future__ import annotations

import re
from pathlib import Path

from packtool.errors import InputError
from packtool.formats.hub_cache import hub_cache_dir, hub_snapshot, is_revision, repo_dir
from packtool.formats.paths import contained
from packtool.stages.tokenize.inputs.locators.base import Found, plain
from packtool.stages.tokenize.inputs.locators.files import expand_dir, expand_glob, kinds_text
from packtool.stages.tokenize.inputs.locators.saved import dataset, is_saved_dataset
from packtool.stages.tokenize.inputs.readers.registry import reader_for

PREFIX = "hf://"
_SPLITS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}


class HubLocator:
    name: str = "hub"

    def claims(self, text: str) -> bool:
        return text.startswith(PREFIX)

    def locate(self, text: str) -> Found:
        """The data files of the cached snapshot (see the module docstring)."""
        snapshot, name, target, within = hub_dataset_target(text)
        if target == snapshot:
            walked = expand_dir(snapshot, within)
            picked = set(pick_data_files(list(walked), snapshot, name, text))
            out = {p: key for p, key in walked.items() if p in picked}
        elif target.is_dir():
            out = dataset(target, text, within) if is_saved_dataset(target) else expand_dir(target, within)
        elif target.is_file():
            out = plain(target) if reader_for(target) else {}
        else:
            out = expand_glob(str(target), within)
        if not out:
            inner = target.relative_to(snapshot).as_posix() if target != snapshot else ""
            where = f" at {inner!r}" if inner else ""
            raise InputError(
                f"dataset {name} in the hub cache ({snapshot}) holds no {kinds_text()}{where}",
                text,
                hint="name a data file, directory or glob inside it: hf://datasets/ORG/NAME/PATH",
            )
        return out


def hub_dataset_target(text: str) -> tuple[Path, str, Path, Path]:
    """`hf://datasets/ORG/NAME[@REVISION][/PATH]` -> (snapshot directory, `ORG/NAME`, the target PATH names (the
    snapshot itself without one), the repo's cache directory: where its files, links into `blobs/`, may lead).

    REVISION is a branch or tag the cache recorded (`refs/REVISION`) or a commit hash (`huggingface_hub`'s own
    `@` syntax); without it, `refs/main`. PATH must stay inside the snapshot (`formats.paths`)."""
    parts = text[len(PREFIX) :].strip("/").split("/")
    repo, at, revision = parts[2].partition("@") if len(parts) > 2 else ("", "", "")
    if len(parts) < 3 or parts[0] != "datasets" or not parts[1] or not repo or (at and not revision):
        raise InputError(
            "not a hub dataset name (expected hf://datasets/ORG/NAME, optionally @REVISION and a path or glob)",
            text,
            hint="write hf://datasets/ORG/NAME[@REVISION][/PATH]",
        )
    name = f"{parts[1]}/{repo}"
    if at and not is_revision(revision):
        raise InputError(
            f"dataset {name} at revision {revision!r} is not in the local Hugging Face cache: a revision is a "
            "branch, tag or commit name, not a path",
            text,
            hint="write hf://datasets/ORG/NAME@REVISION with a branch, tag or commit hash the cache holds",
        )
    snapshot = hub_snapshot("datasets", name, Path.is_dir, revision or None)
    if snapshot is None:
        what = f"dataset {name}" + (f" at revision {revision!r}" if revision else "")
        fetch = f"hf download {name} --repo-type dataset" + (f" --revision {revision}" if revision else "")
        raise InputError(
            f"{what} is not in the local Hugging Face cache ({hub_cache_dir()}); packtool never downloads",
            text,
            hint=f"fetch it with `{fetch}`, or set HF_HUB_CACHE / HF_HOME",
        )
    within = repo_dir("datasets", name).resolve()
    inner = "/".join(parts[3:])
    if not inner:
        return snapshot.resolve(), name, snapshot.resolve(), within
    target = contained(
        snapshot.resolve(),
        inner,
        f"the path after hf://datasets/{name}",
        hint="name a data file, directory or glob inside the dataset: hf://datasets/ORG/NAME/PATH",
        links_within=within,
    )
    return snapshot.resolve(), name, target, within


def pick_data_files(found: list[Path], snapshot: Path, name: str, given: str) -> list[Path]:
    """Of a whole snapshot's files, the data files users expect (see the module docstring).

    Files named for splits with none of them `train` are an InputError naming the splits there."""
    readers = {p: r for p in found if (r := reader_for(p)) is not None}
    if not readers:
        return []
    counts: dict[tuple[int, str], int] = {}  # (rank, family) -> files
    for r in readers.values():
        counts[r.family_rank, r.family] = counts.get((r.family_rank, r.family), 0) + 1
    family = min(counts, key=lambda f: (-counts[f], f))  # the most files; a tie: the lowest rank
    files = [p for p, r in readers.items() if (r.family_rank, r.family) == family]
    by_split = {
        split: [p for p in files if _split_of(p.relative_to(snapshot).as_posix()) == split] for split in _SPLITS
    }
    if by_split["train"] and any(by_split[s] for s in ("validation", "test")):
        return by_split["train"]
    named = [s for s in _SPLITS if by_split[s]]
    if named and not by_split["train"]:
        first = by_split[named[0]][0].relative_to(snapshot).as_posix()
        raise InputError(
            f"dataset {name} has no train split: its data files are named for the {' and '.join(named)} "
            f"split{'s' if len(named) > 1 else ''} ({len(files)} files)",
            given,
            hint=f"name the files to read, e.g. hf://datasets/{name}/{first}",
        )
    return files


def _split_of(relative: str) -> str | None:
    for split, words in _SPLITS.items():
        for word in words:
            if re.search(rf"(^|[-._ /0-9]){word}([-._ /0-9]|$)", relative.lower()):
                return split
    return None
