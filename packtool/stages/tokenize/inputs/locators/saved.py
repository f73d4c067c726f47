"""`datasets` `save_to_disk` directories: one dataset, its Arrow files in `state.json`'s order.

A directory holding `state.json` and `dataset_info.json` (`Dataset.save_to_disk`) is ONE input: its
files, named by `state.json`'s `_data_files`, each inside the directory (`formats.paths`), in the
order listed (they sort at the directory's own place among the inputs). A `DatasetDict` directory
(`dataset_dict.json`) holds several splits: the user names one, and the error lists them.
"""

from __future__ import annotations

import os
from pathlib import Path

from packtool.errors import InputError
from packtool.formats import jsontext
from packtool.formats.oserrors import reading
from packtool.formats.paths import contained
from packtool.formats.sidefiles import SideFileError, read_side_file
from packtool.stages.tokenize.inputs.locators.base import Found, norm

STATE = "state.json"
INFO = "dataset_info.json"
DICT = "dataset_dict.json"
#: how help and errors name what this locator reads
USAGE = "save_to_disk directories"


class SavedDatasetLocator:
    name: str = "save_to_disk"

    def claims(self, text: str) -> bool:
        return Path(text).is_dir() and is_saved_dataset(Path(text))

    def locate(self, text: str) -> Found:
        return dataset(Path(text), text)


def dataset(path: Path, given: str, within: Path | None = None) -> Found:
    """A `save_to_disk` directory's files, keyed to sort in `state.json`'s order at the directory's place."""
    key = str(path.resolve())
    return {norm(p): (key, i) for i, p in enumerate(saved_dataset_files(path, given, within or path))}


def is_saved_dataset(path: Path) -> bool:
    """A `datasets` `save_to_disk` directory (one split) or a `DatasetDict` one (several).

    By the names alone (`lexists`): a `state.json` that is a link to a device or a directory still makes the
    directory a saved dataset, whose reading then refuses that file by name, not a directory of Arrow files."""
    return (_named(path / STATE) and _named(path / INFO)) or _named(path / DICT)


def _named(path: Path) -> bool:
    return os.path.lexists(path)


def saved_dataset_files(path: Path, given: str, within: Path | None = None) -> list[Path]:
    """The Arrow files of a `save_to_disk` directory, in `state.json`'s order.

    Every name `state.json` lists must stay inside the directory, and its file (a link, in the hub cache)
    inside `within` (default: the directory): `formats.paths`."""
    if _named(path / DICT):
        splits = _dataset_dict_splits(path, given)
        raise InputError(
            f"a DatasetDict directory (splits: {', '.join(splits[:10]) or 'none'}{', ...' if len(splits) > 10 else ''}) "
            "is several datasets",
            given,
            hint=f"name one split's directory, e.g. {given.rstrip('/')}/{splits[0] if splits else 'train'}",
        )
    names = _data_file_names(path / STATE, given)
    if not names:
        raise InputError(
            f"the save_to_disk directory lists no data files ({STATE}'s _data_files is empty)",
            given,
            hint="re-save the dataset with Dataset.save_to_disk",
        )
    files = [
        contained(path, name, f"{STATE}'s _data_files", hint=_SAVED_HINT, links_within=within or path) for name in names
    ]
    for file in files:
        if file.suffix != ".arrow" or not file.is_file():
            raise InputError(
                f"{STATE} lists {file.name} but the directory has no such Arrow file",
                given,
                hint="the dataset was copied incompletely; re-save it with Dataset.save_to_disk",
            )
    return files


_SAVED_HINT = (
    "packtool reads only the files inside the directory it is given; re-save the dataset with Dataset.save_to_disk"
)


#: the largest state.json read: datasets writes ~60 bytes per Arrow file, so 16 MiB is some 250,000 of them
MAX_STATE_BYTES = 16 << 20
_LIST_HINT = "re-save the dataset with Dataset.save_to_disk"


def _data_file_names(state: Path, given: str) -> list[str]:
    """The `filename`s of `state.json`'s `_data_files`, each a string; InputError naming what is wrong otherwise.

    Bounded: a `state.json` that is not a regular file or is larger than any file list is refused unread (a
    75 MB one took 1 GB to parse, then failed on its last entry as "KeyError: 'filename'")."""
    with reading(str(state)):
        try:
            text = read_side_file(state, MAX_STATE_BYTES)
        except SideFileError as exc:
            raise InputError(f"{STATE} is not read: {exc}", given, hint=_LIST_HINT) from None
    try:
        data = jsontext.loads(text)
    except ValueError as exc:  # invalid JSON or UTF-8, nesting past the recursion limit
        raise InputError(
            f"cannot read the file list of a save_to_disk directory ({STATE} is not valid JSON: {str(exc)[:200]})",
            given,
            hint=_LIST_HINT,
        ) from exc
    entries = data.get("_data_files") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        got = "no _data_files" if entries is None else f"_data_files is a JSON {_kind(entries)}"
        raise InputError(
            f"cannot read the file list of a save_to_disk directory ({STATE} has {got}, "
            'expected a list of {"filename": NAME})',
            given,
            hint=_LIST_HINT,
        )
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
            raise InputError(
                f"cannot read the file list of a save_to_disk directory ({STATE}'s _data_files[{i}] is "
                f"{'a JSON ' + _kind(entry) if not isinstance(entry, dict) else 'an object without a string filename'}"
                ', expected {"filename": NAME})',
                given,
                hint=_LIST_HINT,
            )
    return [entry["filename"] for entry in entries]


def _kind(value: object) -> str:
    """A JSON value's kind as JSON names it."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _dataset_dict_splits(path: Path, given: str) -> list[str]:
    """The splits `dataset_dict.json` lists (each a directory name inside); else the subdirectories holding a split."""
    try:  # bounded: a larger one, or one that is not a regular file, lists no splits worth reading
        splits = jsontext.loads(read_side_file(path / DICT, MAX_STATE_BYTES)).get("splits")
    except (ValueError, AttributeError, OSError, SideFileError):
        splits = None
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        return sorted(p.name for p in path.iterdir() if p.is_dir() and (p / STATE).is_file())
    for split in splits:
        contained(path, split, f"{DICT}'s splits", hint=_SAVED_HINT, one_part=True)
    return splits
