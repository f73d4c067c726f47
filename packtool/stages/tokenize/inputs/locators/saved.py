"""`datasets` `save_to_disk` directories: one dataset, its Arrow files in `state.json`'s order.

A directory holding `state.json` and `dataset_info.json` (`Dataset.save_to_disk`) is ONE input: its
files, named by `state.json`'s `_data_files`, each inside the directory (`formats.paths`), in the
order listed (they sort at the directory's own place among the inputs). A `DatasetDict` directory
(`dataset_dict.json`) holds several splits: the user names one, and the error lists them.
"""

from __future__ import annotations

import json
from pathlib import Path

from packtool.errors import InputError
from packtool.formats.oserrors import reading
from packtool.formats.paths import contained
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
    """A `datasets` `save_to_disk` directory (one split) or a `DatasetDict` one (several)."""
    return ((path / STATE).is_file() and (path / INFO).is_file()) or (path / DICT).is_file()


def saved_dataset_files(path: Path, given: str, within: Path | None = None) -> list[Path]:
    """The Arrow files of a `save_to_disk` directory, in `state.json`'s order.

    Every name `state.json` lists must stay inside the directory, and its file (a link, in the hub cache)
    inside `within` (default: the directory): `formats.paths`."""
    if (path / DICT).is_file():
        splits = _dataset_dict_splits(path, given)
        raise InputError(
            f"a DatasetDict directory (splits: {', '.join(splits) or 'none'}) is several datasets",
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


def _data_file_names(state: Path, given: str) -> list[str]:
    """The `filename`s of `state.json`'s `_data_files`, each a string; InputError for anything else."""
    with reading(str(state)):
        text = state.read_bytes()
    try:
        entries = json.loads(text)["_data_files"]
        names = [entry["filename"] for entry in entries]
        if not isinstance(entries, list) or not all(isinstance(n, str) for n in names):
            raise TypeError("_data_files must be a list of {'filename': NAME}")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: a hostile nesting
        raise InputError(
            f"cannot read the file list of a save_to_disk directory ({STATE}: {type(exc).__name__}: {str(exc)[:200]})",
            given,
            hint="re-save the dataset with Dataset.save_to_disk",
        ) from exc
    return names


def _dataset_dict_splits(path: Path, given: str) -> list[str]:
    """The splits `dataset_dict.json` lists (each a directory name inside); else the subdirectories holding a split."""
    try:
        splits = json.loads((path / DICT).read_bytes()).get("splits")
    except (ValueError, AttributeError, OSError, RecursionError):
        splits = None
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        return sorted(p.name for p in path.iterdir() if p.is_dir() and (p / STATE).is_file())
    for split in splits:
        contained(path, split, f"{DICT}'s splits", hint=_SAVED_HINT, one_part=True)
    return splits
