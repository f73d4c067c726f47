"""Which files of a hub dataset `load_dataset(NAME, SUBSET, split=SPLIT)` reads, from the repo's file list.

As `datasets` 5.2 resolves it (`datasets/load.py`, `datasets/data_files.py`), on the cases met in practice:
1. The README's YAML `configs:` list, when there is one: the subset is a `config_name` (left out: the one
   marked `default: true`, the one named `default`, or the only one; several and none of these is an error
   listing them); its `data_files` (a pattern, a list, `{split: ...}` or `[{split, path}]`) name each split's
   files, or its `data_dir` is searched with the default patterns below.
2. Otherwise the default patterns, the first that matches any file winning: `data/{split}-NNNNN-of-NNNNN*.*`
   (the splits `push_to_hub` writes), directories named for a split (`train/`, `data/test/`, ...), file names
   holding a split word (`train.jsonl`, `my-valid_01.csv`), and last everything as `train`. Split words are
   datasets' own (`train`/`training`, `validation`/`valid`/`dev`/`val`, `test`/`testing`/`eval`/`evaluation`).
   Hidden paths, `__*` directories and the card files (`README.md`, `dataset_infos.json`, ...) never count.
3. The refs/convert/parquet branch (the hub's own Parquet export, for a dataset kept as a loading script or in
   a form `datasets` no longer reads): `CONFIG/SPLIT/NNNN.parquet`, or the older `CONFIG/NAME-SPLIT[-NNNNN-of-
   NNNNN].parquet`. A `partial-SPLIT` directory (an export cut at 5 GB) is refused by name.

A split left out is `train`, as a store is one split; one that is not there is an error listing those that
are. A split's files are read in datasets' order: pattern by pattern, each pattern's matches sorted (a card's
`path: [b.jsonl, a.jsonl]` reads b first). Of the split's files, the most common readable family is read (as `datasets` infers its builder from the
most common extension, Parquet winning a tie); a split whose files are mostly of a kind packtool does not read
is refused by name, never read as another kind.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import yaml

from packtool.errors import InputError
from packtool.stages.tokenize.inputs.readers.registry import reader_for

SPLIT_WORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
CARD_FILES = frozenset(
    {"README.md", "config.json", "dataset_info.json", "dataset_infos.json", "dummy_data.zip", "dataset_dict.json"}
)
CONVERT_BRANCH = "refs/convert/parquet"
_SEP = "-._ 0-9"
_SHARDED = re.compile(r"^data/(?P<split>[^/]+?)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*$")
_OLD_CONVERTED = re.compile(r"^(?P<stem>.+)-(?P<split>[^-]+?)(-[0-9]{5}-of-[0-9]{5})?\.parquet$")
#: data kinds `datasets` has builders for and packtool no reader: a split mostly of these is refused
_FOREIGN = frozenset(
    [
        ".tar",
        ".zip",
        ".xml",
        ".h5",
        ".hdf5",
        ".lance",
        ".vortex",
        ".eval",
        ".sql",
        ".npy",
        ".npz",
        ".pdf",
        ".wav",
        ".mp3",
        ".flac",
        ".ogg",
        ".opus",
        ".m4a",
        ".mp4",
        ".avi",
        ".mov",
        ".mkv",
        ".webm",
        ".jpg",
        ".jpeg",
        ".png",
        ".gif",
        ".bmp",
        ".tif",
        ".tiff",
        ".webp",
        ".nii",
        ".dcm",
    ]
)


@dataclass(frozen=True)
class Selected:
    """What a subset and split name: the files read, and the names that were resolved."""

    subset: str
    split: str
    files: tuple[str, ...]


def read_card_configs(readme: str | None, where: str) -> list[dict[str, Any]]:
    """The `configs:` list of a dataset card's YAML header ([] without one); a malformed one is an InputError."""
    if not readme or not readme.startswith("---"):
        return []
    end = readme.find("\n---", 3)
    if end < 0:
        return []
    try:
        header = yaml.safe_load(readme[3:end])
    except yaml.YAMLError as exc:
        raise InputError(
            f"the dataset card's YAML header does not parse ({exc})", where, hint="fix README.md"
        ) from None
    configs = header.get("configs") if isinstance(header, dict) else None
    if configs is None:
        return []
    if not isinstance(configs, list) or not all(isinstance(c, dict) and "config_name" in c for c in configs):
        raise InputError(
            "the dataset card's `configs:` is not a list of mappings with a config_name", where, hint="fix README.md"
        )
    return configs


def select(
    files: Sequence[str],
    readme: str | None,
    subset: str | None,
    split: str | None,
    name: str,
    given: str,
    converted: bool = False,
) -> Selected:
    """The files `load_dataset(name, subset, split=split)` reads of a repo holding `files` (see the docstring)."""
    if converted:
        splits, subset = _converted_splits(files, subset, name, given)
    else:
        configs = read_card_configs(readme, given)
        if configs:
            config = _pick_config(configs, subset, name, given)
            subset = str(config["config_name"])
            splits = _config_splits(files, config, name, given)
        else:
            if subset not in (None, "default"):
                raise InputError(
                    f"dataset {name} has no subset {subset!r}: its card declares no `configs:`, so its one subset "
                    "is 'default'",
                    given,
                    hint="leave --subset out",
                )
            subset = "default"
            splits = default_splits(files)
    if not splits:
        raise InputError(f"dataset {name} holds no data files", given, hint="check the repo on the hub")
    want = split or "train"
    if want not in splits:
        have = ", ".join(splits)
        what = f"dataset {name}" + (f" (subset {subset})" if subset != "default" else "")
        raise InputError(
            f"{what} has no {want} split: its data files are for the {' and '.join(splits)} split"
            f"{'s' if len(splits) > 1 else ''}",
            given,
            hint=f"pass --split NAME with one of: {have}",
        )
    return Selected(subset, want, tuple(_readable(splits[want], name, want, given)))


def default_splits(files: Sequence[str], base: str = "") -> dict[str, list[str]]:
    """Split -> files by datasets' default patterns under `base` ("" or a directory) ({} when none match)."""
    prefix = base.strip("/") + "/" if base.strip("/") else ""
    pool = [f[len(prefix) :] for f in files if f.startswith(prefix) and _visible(f[len(prefix) :])]
    sharded: dict[str, list[str]] = {}
    for f in pool:
        m = _SHARDED.match(f)
        if m:
            sharded.setdefault(m["split"], []).append(prefix + f)
    if sharded:
        return _ordered(sharded)
    for patterns in _DEFAULT_PATTERNS:
        found = {split: [prefix + f for f in _in_pattern_order(sorted(pool), regexes)] for split, regexes in patterns}
        found = {s: v for s, v in found.items() if v}
        if found:
            return found
    return {}


def _ordered(splits: dict[str, list[str]]) -> dict[str, list[str]]:
    known = [s for s in SPLIT_WORDS if s in splits]
    return {s: sorted(splits[s]) for s in known + sorted(set(splits) - set(known))}


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A glob as fsspec (>= 2023.12) and Python's glob read it: `**` any depth (whole parts), `*` and `?` inside
    one part, `[...]` a class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _patterns(templates: Sequence[str], words: Sequence[str]) -> list[re.Pattern[str]]:
    return [glob_regex(t.format(keyword=w, sep=_SEP)) for w in words for t in templates]


_IN_NAME = ("**/{keyword}[{sep}]*", "**/*[{sep}]{keyword}[{sep}]*")
_IN_DIR = ("**/{keyword}/**", "**/{keyword}[{sep}]*/**", "**/*[{sep}]{keyword}/**", "**/*[{sep}]{keyword}[{sep}]*/**")
_DEFAULT_PATTERNS: list[list[tuple[str, list[re.Pattern[str]]]]] = [
    [("logs", [glob_regex("**/*.eval")])],
    [("test", [glob_regex("**/task.toml"), glob_regex("**/instruction.md")])],
    [(split, _patterns(_IN_DIR, words)) for split, words in SPLIT_WORDS.items()],
    [(split, _patterns(_IN_NAME, words)) for split, words in SPLIT_WORDS.items()],
    [("train", [glob_regex("**")])],
]


def _visible(path: str) -> bool:
    """Not hidden, not in a `__*` directory, not a card file: what datasets' pattern resolution keeps."""
    parts = PurePosixPath(path).parts
    return (
        bool(parts)
        and not any(p.startswith(".") for p in parts)
        and not any(p.startswith("__") for p in parts[:-1])
        and parts[-1] not in CARD_FILES
    )


def _pick_config(configs: list[dict[str, Any]], subset: str | None, name: str, given: str) -> dict[str, Any]:
    by_name = {str(c["config_name"]): c for c in configs}
    names = ", ".join(by_name)
    if subset is not None:
        if subset not in by_name:
            raise InputError(
                f"dataset {name} has no subset {subset!r}", given, hint=f"pass --subset with one of: {names}"
            )
        return by_name[subset]
    defaults = [n for n, c in by_name.items() if len(by_name) == 1 or n == "default" or c.get("default")]
    if len(defaults) > 1:
        raise InputError(f"dataset {name}'s card marks several default subsets ({', '.join(defaults)})", given,
                         hint=f"pass --subset with one of: {names}")  # fmt: skip
    if not defaults:
        raise InputError(f"dataset {name} has several subsets and no default one", given,
                         hint=f"pass --subset with one of: {names}")  # fmt: skip
    return by_name[defaults[0]]


def _config_splits(files: Sequence[str], config: dict[str, Any], name: str, given: str) -> dict[str, list[str]]:
    data_dir = str(config.get("data_dir") or "").strip("/")
    spec = config.get("data_files")
    if spec is None:
        return default_splits(files, data_dir)
    prefix = data_dir + "/" if data_dir else ""
    out: dict[str, list[str]] = {}
    for split, patterns in _sanitize(spec, name, given).items():
        regexes = [glob_regex(prefix + p.lstrip("/")) for p in patterns]
        matched = _in_pattern_order(sorted(f for f in files if _visible(f)), regexes)
        if not matched:
            raise InputError(
                f"dataset {name}'s subset {config['config_name']!r} names files for its {split} split "
                f"({', '.join(patterns)}) that the repo does not hold",
                given,
                hint="check the card's `configs:` data_files",
            )
        out[split] = matched
    return out


def _in_pattern_order(files: Sequence[str], regexes: Sequence[re.Pattern[str]]) -> list[str]:
    """The files matching any of `regexes`, as datasets lists them: pattern by pattern (each pattern's matches in
    sorted order), so `[b.jsonl, a.jsonl]` reads b first and `test` files come before `eval` ones; a file that
    two patterns match is read once (datasets would read it twice)."""
    out: dict[str, None] = {}
    for rx in regexes:
        out.update((f, None) for f in files if rx.match(f) and f not in out)
    return list(out)


def _sanitize(spec: Any, name: str, given: str) -> dict[str, list[str]]:
    """datasets' `sanitize_patterns` of a card's data_files: a pattern, a list, or [{split, path}] -> split -> list
    (a mapping is refused, as datasets refuses it in a card)."""
    if isinstance(spec, str):
        return {"train": [spec]}
    if isinstance(spec, list) and all(isinstance(x, dict) and "split" in x and "path" in x for x in spec):
        return {str(x["split"]): [str(p) for p in (x["path"] if isinstance(x["path"], list) else [x["path"]])]
                for x in spec}  # fmt: skip
    if isinstance(spec, list) and all(isinstance(x, str) for x in spec):
        return {"train": list(spec)}
    raise InputError(f"dataset {name}'s card has data_files of a form datasets does not read ({spec!r})", given,
                     hint="fix the card's `configs:`")  # fmt: skip


def _converted_splits(
    files: Sequence[str], subset: str | None, name: str, given: str
) -> tuple[dict[str, list[str]], str]:
    """The Parquet export's layout: CONFIG/SPLIT/NNNN.parquet (or CONFIG/NAME-SPLIT[-NNNNN-of-NNNNN].parquet)."""
    layout: dict[str, dict[str, list[str]]] = {}
    for f in files:
        parts = f.split("/")
        if not f.endswith(".parquet") or len(parts) not in (2, 3) or not _visible(f):
            continue
        if len(parts) == 3:
            split = parts[1]
        else:
            m = _OLD_CONVERTED.match(parts[1])
            if m is None:
                continue
            split = m["split"]
        layout.setdefault(parts[0], {}).setdefault(split, []).append(f)
    names = ", ".join(layout)
    if subset is None:
        if len(layout) > 1 and "default" not in layout:
            raise InputError(f"dataset {name}'s Parquet export ({CONVERT_BRANCH}) has several subsets", given,
                             hint=f"pass --subset with one of: {names}")  # fmt: skip
        subset = "default" if "default" in layout else next(iter(layout), "default")
    if subset not in layout:
        raise InputError(f"dataset {name}'s Parquet export ({CONVERT_BRANCH}) has no subset {subset!r}", given,
                         hint=f"pass --subset with one of: {names or '(none)'}")  # fmt: skip
    splits = layout[subset]
    partial = [s for s in splits if s.startswith("partial-")]
    if partial:
        raise InputError(
            f"dataset {name}'s Parquet export ({CONVERT_BRANCH}) holds only part of the {subset} subset's "
            f"{', '.join(s.removeprefix('partial-') for s in partial)} split (the hub converts the first 5 GB)",
            given,
            hint=f"tokenize the repo's own files instead (hf download {name} --repo-type dataset)",
        )
    return _ordered(splits), subset


def _readable(files: Sequence[str], name: str, split: str, given: str) -> list[str]:
    """The split's files of its most common readable family; a split mostly of a foreign kind is refused."""
    counts: dict[str, list[str]] = {}
    ranks: dict[str, int] = {}
    foreign: dict[str, int] = {}
    for f in files:
        reader = reader_for(PurePosixPath(f))
        if reader is not None and PurePosixPath(f).name not in reader.not_data:
            counts.setdefault(reader.family, []).append(f)
            ranks[reader.family] = reader.family_rank
        elif (suffix := PurePosixPath(f).suffix.lower()) in _FOREIGN:
            foreign[suffix] = foreign.get(suffix, 0) + 1
    best = min(counts, key=lambda k: (-len(counts[k]), ranks[k], k)) if counts else None  # a tie: Parquet first
    top_foreign = max(foreign, key=lambda k: foreign[k]) if foreign else None
    if top_foreign is not None and (best is None or foreign[top_foreign] > len(counts[best])):
        raise InputError(
            f"dataset {name}'s {split} split is stored as {top_foreign} files ({foreign[top_foreign]}), which "
            "packtool does not read",
            given,
            hint=f"convert them to parquet or jsonl, or name readable files: hf://datasets/{name}/PATH",
        )
    if best is None:
        raise InputError(f"dataset {name}'s {split} split holds no file packtool reads ({len(files)} files)", given,
                         hint=f"name the files to read: hf://datasets/{name}/PATH")  # fmt: skip
    return counts[best]  # in the split's order (datasets': pattern by pattern)
