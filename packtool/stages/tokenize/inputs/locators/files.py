"""Files, directories and globs on the local disk.

A file is read when some reader reads its suffix. A directory is walked recursively (hidden paths
pruned, linked directories not entered, the metadata files a reader names as `not_data` left out;
a `save_to_disk` directory met on the way is one dataset). A glob is expanded as Python's `glob`
does (`**` recursive). A link that a walk or a glob finds must lead to a file inside the directory
walked (the glob's fixed leading directory): one leading out, nowhere or in a loop is an error
naming it (`formats.paths`); a link named as an argument is followed.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from packtool.errors import InputError
from packtool.formats.paths import check_within
from packtool.stages.tokenize.inputs.locators.base import Found, plain
from packtool.stages.tokenize.inputs.locators.saved import USAGE, dataset, is_saved_dataset
from packtool.stages.tokenize.inputs.readers.registry import reader_for, suffix_list, suffix_text

_LINK_HINT = "name the file itself to read it (a link you name is followed), or fix or remove the link"


def kinds_text() -> str:
    """What packtool reads, for errors: `.jsonl(.gz|.zst), ..., .txt, save_to_disk directories`."""
    return f"{suffix_text()}, {USAGE}"


class DirectoryLocator:
    name: str = "directory"

    def claims(self, text: str) -> bool:
        return Path(text).is_dir()

    def locate(self, text: str) -> Found:
        matches = expand_dir(Path(text))
        if not matches:
            raise InputError(f"directory holds no {kinds_text()}", text, hint="check the path")
        return matches


class FileLocator:
    name: str = "file"

    def claims(self, text: str) -> bool:
        return Path(text).exists()

    def locate(self, text: str) -> Found:
        path = Path(text)
        if not path.is_file():
            raise InputError("is not a regular file (a device, a pipe or a socket)", text, hint="pass a file")
        if reader_for(path) is None:
            raise InputError(
                f"unsupported input type (expected {suffix_list()})", text, hint="rename or convert the file"
            )
        return plain(path)


class GlobLocator:
    name: str = "glob"

    def claims(self, text: str) -> bool:
        return True

    def locate(self, text: str) -> Found:
        matches = expand_glob(text) if glob.has_magic(text) else {}  # no wildcard: a path that does not exist
        if not matches:
            raise InputError(
                "input does not exist or the glob matches no supported file",
                text,
                hint="check the path or quote the glob",
            )
        return matches


def expand_dir(path: Path, within: Path | None = None) -> Found:
    """A directory's readable files; links among them must lead inside it (inside `within`, when given)."""
    root = within or path
    out: Found = {}
    for p in _walk_files(path):
        if p.is_dir():  # a save_to_disk directory (the walk enters no linked directory)
            out.update(dataset(p, str(p), root))
            continue
        reader = reader_for(p)
        if reader is None or _hidden(p, path) or p.name in reader.not_data:
            continue
        if p.is_symlink():  # the walk enters no linked directory: only the file itself can be a link
            _found(p, root, "the directory walk")
        if p.is_file():  # not a pipe or a socket
            out.update(plain(p))
    return out


def expand_glob(pattern: str, within: Path | None = None) -> Found:
    """A glob's readable files; every match must lie inside the glob's fixed directory (or `within`)."""
    root = within or _glob_base(pattern)
    out: Found = {}
    for p in map(Path, glob.glob(pattern, recursive=True)):  # `**` enters linked directories: check every match
        if p.is_dir() and is_saved_dataset(p):
            out.update(dataset(_found(p, root, "the glob"), str(p), root))
        elif reader_for(p) and (p.is_file() or p.is_symlink()) and _found(p, root, "the glob").is_file():
            out.update(plain(p))
    return out


def _walk_files(root: Path) -> list[Path]:
    """Files under `root`, hidden directories pruned, symlinked directories not followed (as rglob);
    a directory that cannot be listed raises instead of being skipped silently. A `save_to_disk`
    directory met on the way is listed itself, not walked: `expand_dir` expands it."""

    def fail(exc: OSError) -> None:
        raise exc

    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if is_saved_dataset(Path(dirpath)):
            dirnames[:] = []
            out.append(Path(dirpath))
            continue
        out.extend(Path(dirpath) / name for name in filenames)
    return out


def _found(path: Path, root: Path, how: str) -> Path:
    """A file a directory walk or a glob found: it must lead to a file inside `root` (`formats.paths`): a
    link leading out, nowhere or in a loop is an error, never skipped or followed."""
    check_within(path, root, f"a {'link' if path.is_symlink() else 'path'} that {how} found", hint=_LINK_HINT)
    if path.is_symlink() and not path.exists():
        raise InputError(f"a link that {how} found leads to no file", str(path), hint="fix or remove the link")
    return path


def _glob_base(pattern: str) -> Path:
    """The directory a glob lies in: its parts before the first one with a wildcard."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    return Path(*parts[:fixed]) if fixed else Path(".")


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)
