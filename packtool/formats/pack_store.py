"""The pack store: every byte under `ROOT/packed/{tokenizer_name}/` for a split S and size N.

Layout (Megatron-Bridge users know the `{split}_{N}.npy` + `{N}_metadata.jsonl` pair):
`{S}_{N}.npy` is a real 2-D `.npy` `[n_packs, N]` of token ids, and CSR companions say
which segment (document or fragment) sits where, so that the loader needs no JSON per pack.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import FormatError
from packtool.formats import jsontext
from packtool.formats.atomic import atomic_file
from packtool.formats.files import check_file_records, sha256_bytes, sha256_file
from packtool.formats.files import file_records as file_records  # re-exported for writers and tests
from packtool.formats.pack_checks import VISION_COMPANIONS, check_metadata_numbers, check_vision_arrays, vision_of
from packtool.formats.sidefiles import SideFileError, read_side_file
from packtool.formats.token_store import MAX_STORE_JSON_BYTES, is_token_store, parse_dtype

FORMAT_NAME = "packtool.packs"
FORMAT_VERSION = 3  # the newest this packtool reads and writes (docs/FORMAT.md, "Versioning")
#: 2: files of a build carry its id, the metadata line is the commit point (every single-store pack)
SINGLE_SOURCE_VERSION = 2
#: 3: `source` is a LIST (a mixture, weights or --validation); seg_doc/seg_src address the sources' global space
MIXTURE_VERSION = 3
SPLITS = ("training", "validation", "test")

#: companion arrays: suffix -> dtype (the comment says what each holds)
COMPANIONS: dict[str, np.dtype] = {
    "pack_offsets": np.dtype("<i8"),  # [n_packs + 1] CSR row pointer into the segment arrays
    "seg_lens": np.dtype("<i4"),  # [n_segments] tokens per segment, --pad-multiple padding included
    "seg_pad": np.dtype("<i4"),  # [n_segments] of those, how many are --pad-multiple padding (at the end)
    "seg_doc": np.dtype("<i8"),  # [n_segments] document index in the token store
    "seg_src": np.dtype("<i8"),  # [n_segments] start offset of the segment's tokens in tokens.bin
}
#: companions of a preference pack store only (its metadata line has a `preference` key): one entry per segment
PAIR_COMPANIONS: dict[str, np.dtype] = {
    "seg_pair": np.dtype("<i8"),  # [n_segments] pair index in the token store(s) (= seg_doc // 2)
    "seg_role": np.dtype("u1"),  # [n_segments] ROLE_* below: which part of its pair the segment is
}
ALL_COMPANIONS: dict[str, np.dtype] = {**COMPANIONS, **PAIR_COMPANIONS, **VISION_COMPANIONS}
LOSS_DTYPE = np.dtype("u1")

#: `seg_role` values. A pair is 2 consecutive segments [CHOSEN][REJECTED] (whole sequences) or, with
#: `--share-prompt`, 3 [PROMPT][CHOSEN_COMPLETION][REJECTED_COMPLETION] whose completions continue the prompt.
ROLE_CHOSEN = 1
ROLE_REJECTED = 2
ROLE_PROMPT = 3
ROLE_CHOSEN_COMPLETION = 4
ROLE_REJECTED_COMPLETION = 5
ROLE_NAMES = {
    ROLE_CHOSEN: "chosen",
    ROLE_REJECTED: "rejected",
    ROLE_PROMPT: "prompt",
    ROLE_CHOSEN_COMPLETION: "chosen completion",
    ROLE_REJECTED_COMPLETION: "rejected completion",
}
#: the `layout` of a preference metadata line: whole sequences, or the prompt held once
PAIR_LAYOUTS = ("pairs", "shared-prompt")


def attended_prefix(seg_lens: np.ndarray, seg_role: np.ndarray | None) -> np.ndarray | None:
    """int64 per segment: the tokens of ANOTHER segment its queries also attend (a shared-prompt completion:
    its prompt's length; 0 elsewhere), or None when no segment attends outside itself (plain, pairs layout).

    What the attention cost of a segment depends on besides its own length (`CostModel.packs(prefix=...)`):
    a completion after a prompt of p tokens costs what p + c tokens cost minus the prompt's own p."""
    if seg_role is None:
        return None
    role = np.asarray(seg_role)
    back = np.where(role == ROLE_CHOSEN_COMPLETION, 1, np.where(role == ROLE_REJECTED_COMPLETION, 2, 0))
    if not back.any():
        return None
    lens = np.asarray(seg_lens, np.int64)
    at = np.arange(lens.size, dtype=np.int64) - back
    return np.where(back > 0, lens[np.maximum(at, 0)], 0).astype(np.int64)


def safe_name(name: str) -> str:
    """A file-system safe directory name for a tokenizer (`org/model` -> `org--model`)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name.replace("/", "--")).strip(".-")
    return cleaned or "tokenizer"


def pack_dir(root: str | os.PathLike[str], tokenizer_name: str) -> Path:
    return Path(root) / "packed" / safe_name(tokenizer_name)


def data_name(split: str, size: int, build: str | None = None) -> str:
    """`{S}_{N}.npy` (the plain alias, or a version-1 store's data file); `{S}_{N}.{build}.npy` for a build."""
    return f"{split}_{size}.npy" if build is None else f"{split}_{size}.{build}.npy"


_DATA_NAME = re.compile(r"^(?P<split>[^.]+)_(?P<size>\d+)(?:\.(?P<build>[0-9a-f]{16}))?\.npy$")
_ROLES = "|".join([*ALL_COMPANIONS, "loss"])
#: a file of one build (version 2): `{S}_{N}.{build}.npy` or `{S}_{N}.{build}.{role}.npy`
BUILD_FILE = re.compile(rf"^(?P<split>[^.]+)_(?P<size>\d+)\.(?P<build>[0-9a-f]{{16}})\.(?:(?:{_ROLES})\.)?npy$")
#: a version-1 companion or loss file (`{S}_{N}.{role}.npy`), replaced by a version-2 build
LEGACY_FILE = re.compile(rf"^(?P<split>[^.]+)_(?P<size>\d+)\.(?:{_ROLES})\.npy$")
_BUILD_ID = re.compile(r"^[0-9a-f]{16}$")


def parse_data_name(name: str) -> tuple[str, int] | None:
    """(split, N) of a `{split}_{N}.npy` or `{split}_{N}.{build}.npy` name; None for any other (companions)."""
    m = _DATA_NAME.match(name)
    return (m["split"], int(m["size"])) if m else None


def companion_name(split: str, size: int, what: str, build: str | None = None) -> str:
    return f"{split}_{size}.{what}.npy" if build is None else f"{split}_{size}.{build}.{what}.npy"


def loss_name(split: str, size: int, build: str | None = None) -> str:
    return companion_name(split, size, "loss", build)


def metadata_name(size: int) -> str:
    return f"{size}_metadata.jsonl"


def file_names(
    split: str,
    size: int,
    with_loss: bool,
    build: str | None = None,
    with_pairs: bool = False,
    with_vision: bool = False,
) -> list[str]:
    """Every file of one (split, size) in a fixed order: of build `build`, or version-1 names when None.
    `with_pairs`: a preference pack store's `seg_pair`/`seg_role` too (after the other companions);
    `with_vision`: a vision pack store's image CSR (`pack_checks.VISION_COMPANIONS`)."""
    names = [data_name(split, size, build)] + [companion_name(split, size, c, build) for c in COMPANIONS]
    names += [companion_name(split, size, c, build) for c in PAIR_COMPANIONS] if with_pairs else []
    names += [companion_name(split, size, c, build) for c in VISION_COMPANIONS] if with_vision else []
    return names + ([loss_name(split, size, build)] if with_loss else [])


def preference_of(meta: dict[str, Any], where: object = "") -> dict[str, Any] | None:
    """The `preference` record of a metadata line (`pairs`, `layout`, ...), None for a plain pack store."""
    pref = meta.get("preference")
    if pref is None:
        return None
    if not isinstance(pref, dict) or pref.get("layout") not in PAIR_LAYOUTS:
        raise FormatError(
            f"metadata preference {pref!r} has no layout of {', '.join(PAIR_LAYOUTS)}, {where}, re-run `packtool pack`"
        )
    return pref


def build_id(sha256_by_name: dict[str, str], salt: str | None = None) -> str:
    """A build's id: 16 hex digits of the sha256 over its files' hashes (same bytes, same id, same names).

    `salt` (a mixture's spec: sources, weights, validation fraction) is hashed in too when given.
    """
    text = "".join(f"{name} {digest}\n" for name, digest in sorted(sha256_by_name.items()))
    if salt is not None:
        text += f"spec {salt}\n"
    return sha256_bytes(text.encode())[:16]


def metadata_build(meta: dict[str, Any], where: str) -> str | None:
    """The build id of a metadata line (version 2); None for a version-1 line (plain file names)."""
    if int(meta.get("format_version", 1)) < 2:
        return None
    build = meta.get("build")
    if not isinstance(build, str) or not _BUILD_ID.match(build):
        raise FormatError(
            f"metadata build {build!r} of split {meta.get('split')!r} is not 16 hex digits, {where}, re-run `packtool pack`"
        )
    return build


def metadata_sources(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The source records of a metadata line as a list: version 3 writes a list, 1 and 2 one object."""
    source = meta.get("source")
    if isinstance(source, list):
        return [s for s in source if isinstance(s, dict)]
    return [source] if isinstance(source, dict) else []


def read_metadata(directory: Path, size: int) -> list[dict[str, Any]]:
    """All lines of `{N}_metadata.jsonl` (one object per split); [] when absent."""
    path = Path(directory) / metadata_name(size)
    if not path.exists():
        return []
    try:  # one line per split: a few kB; a link to /dev/zero was read until a MemoryError
        text = read_side_file(path, MAX_STORE_JSON_BYTES).decode("utf-8")
    except (SideFileError, UnicodeDecodeError) as exc:
        raise FormatError(f"pack metadata is not read ({exc}), {path}, re-run `packtool pack`") from None
    records = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = jsontext.loads(line)
        except json.JSONDecodeError as exc:
            raise FormatError(
                f"invalid JSON in pack metadata ({exc.msg}), {path}:{lineno}, re-run `packtool pack`"
            ) from exc
        if not isinstance(rec, dict) or "split" not in rec:
            raise FormatError(
                f"pack metadata line is not an object with a 'split', {path}:{lineno}, re-run `packtool pack`"
            )
        records.append(rec)
    return records


def metadata_for(directory: Path, split: str, size: int) -> dict[str, Any]:
    where = Path(directory) / metadata_name(size)
    for rec in read_metadata(directory, size):
        if rec["split"] == split:
            version = rec.get("format_version")
            if isinstance(version, bool) or not isinstance(version, int):
                raise FormatError(
                    f"pack store format_version must be an integer, got {version!r} ({type(version).__name__}), {where}, re-run `packtool pack`"
                )
            if not 1 <= version <= FORMAT_VERSION:
                raise FormatError(
                    f"pack store format_version {version!r} is not supported (this packtool reads 1 to {FORMAT_VERSION}), {where}, upgrade packtool or re-pack"
                )
            return rec
    raise FormatError(
        f"no metadata line for split {split!r} at size {size}, {where}, run `packtool pack --split {split} --size {size}`"
    )


def write_metadata_line(directory: Path, *records: dict[str, Any], drop: tuple[str, ...] = ()) -> None:
    """Insert or replace the line of each record's `split` in `{N}_metadata.jsonl`, in ONE atomic rewrite
    (so the splits of one `--validation` run are committed together, never one without the other).

    Read-modify-write: writers hold the pack directory's lock (`formats.locks.exclusive_output`).
    The rename of this file is the commit point of a version-2 build. `drop`: splits whose lines go in the
    same rewrite (a validation split that the new training split would overlap).
    """
    size = int(records[0]["pack_size"])
    if any(int(r["pack_size"]) != size for r in records):
        raise ValueError("records of one metadata rewrite must share a pack size")
    splits = {r["split"] for r in records} | set(drop)
    kept = [r for r in read_metadata(directory, size) if r["split"] not in splits]
    kept.extend(records)
    kept.sort(key=lambda r: (SPLITS.index(r["split"]) if r["split"] in SPLITS else len(SPLITS), str(r["split"])))
    text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in kept)
    with atomic_file(Path(directory) / metadata_name(size), "wb") as fh:
        fh.write(text.encode())  # type: ignore[attr-defined]


@dataclass
class PackSplit:
    """One (split, size) of a pack store, memory-mapped read-only and checked."""

    directory: Path
    split: str
    size: int
    metadata: dict[str, Any]
    tokens: np.ndarray  # [n_packs, N]
    pack_offsets: np.ndarray
    seg_lens: np.ndarray
    seg_pad: np.ndarray
    seg_doc: np.ndarray
    seg_src: np.ndarray
    loss: np.ndarray | None
    build: str | None = None  # version 2: the build whose files these are (None: version-1 names)
    seg_pair: np.ndarray | None = None  # a preference pack store: pair index per segment
    seg_role: np.ndarray | None = None  # a preference pack store: ROLE_* per segment
    images: dict[str, np.ndarray] | None = None  # a vision pack store: `pack_checks.VISION_COMPANIONS` by name

    @property
    def preference(self) -> dict[str, Any] | None:
        """The metadata's `preference` record (pairs, layout, ...), None for a plain pack store."""
        return preference_of(self.metadata)

    @property
    def shared_prompt(self) -> bool:
        """Pairs packed as [prompt][chosen completion][rejected completion] (`--share-prompt`)."""
        pref = self.preference
        return pref is not None and pref.get("layout") == "shared-prompt"

    def file_name(self, role: str = "data") -> str:
        """The name of this split's `data`, `loss` or companion file (of its build)."""
        if role == "data":
            return data_name(self.split, self.size, self.build)
        return companion_name(self.split, self.size, role, self.build)

    @property
    def n_packs(self) -> int:
        return int(self.tokens.shape[0])


def _load(path: Path, dtype: np.dtype, ndim: int) -> np.ndarray:
    if not path.is_file():
        raise FormatError(f"{path.name} is missing, {path.parent}, re-run `packtool pack`")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise FormatError(
            f"{path.name} is not a readable .npy ({exc}; truncated or corrupted), {path}, re-run `packtool pack`"
        ) from exc
    if arr.ndim != ndim or arr.dtype.kind != dtype.kind or arr.dtype.itemsize != dtype.itemsize:
        raise FormatError(
            f"{path.name} has dtype {arr.dtype} and {arr.ndim} dims, expected {dtype} with {ndim}, {path}, re-run `packtool pack`"
        )
    return arr


def open_pack_split(
    directory: str | os.PathLike[str], split: str, size: int, *, check_hashes: bool = False
) -> PackSplit:
    """Open one split at one size after checking metadata, shapes and CSR consistency.

    Only the files the metadata line names are opened (version 2: those of its build), so files of
    an interrupted or concurrent run are never mixed in. With `check_hashes`, the plain alias
    `{S}_{N}.npy` must also hold the build's data.
    """
    d = Path(directory)
    where = f"{d / metadata_name(size)} (split {split})"
    meta = metadata_for(d, split, size)
    build = metadata_build(meta, where)
    files = meta.get("files")
    if build is None:
        with_loss = (d / loss_name(split, size)).exists()
    else:
        with_loss = isinstance(files, dict) and loss_name(split, size, build) in files
    with_pairs = preference_of(meta, where) is not None
    if with_pairs and build is None:
        raise FormatError(f"a preference split must be a version-2 build, {where}, re-run `packtool pack`")
    with_vision = vision_of(meta, where) is not None
    names = file_names(split, size, with_loss, build, with_pairs, with_vision)
    check_file_records(d, files, names, check_hashes=check_hashes, where=where, fix="re-run `packtool pack`")
    if build is not None and set(files) != set(names):  # type: ignore[arg-type]
        extra = sorted(set(files) - set(names))  # type: ignore[arg-type]
        raise FormatError(
            f"the files map names files of another build ({', '.join(extra)}), {where}, re-run `packtool pack`"
        )
    token_dtype = parse_dtype(meta.get("dtype"), str(d / metadata_name(size)))
    tokens = _load(d / data_name(split, size, build), token_dtype, 2)
    wanted = {**COMPANIONS, **(PAIR_COMPANIONS if with_pairs else {}), **(VISION_COMPANIONS if with_vision else {})}
    arrays = {c: _load(d / companion_name(split, size, c, build), dt, 1) for c, dt in wanted.items()}
    lname = loss_name(split, size, build)
    loss = _load(d / lname, LOSS_DTYPE, 2) if with_loss else None
    n_packs = int(tokens.shape[0])
    if tokens.shape[1] != size:
        raise FormatError(
            f"{data_name(split, size, build)} has rows of {tokens.shape[1]} tokens, expected {size}, {d}, re-run `packtool pack`"
        )
    po = arrays["pack_offsets"]
    n_seg = int(arrays["seg_lens"].size)
    if po.size != n_packs + 1 or int(po[0]) != 0 or int(po[-1]) != n_seg or bool(np.any(np.diff(po) < 0)):
        raise FormatError(
            f"pack_offsets is inconsistent with {n_packs} packs and {n_seg} segments, {d}, re-run `packtool pack`"
        )
    for c in ("seg_pad", "seg_doc", "seg_src", *(PAIR_COMPANIONS if with_pairs else ())):
        if arrays[c].size != n_seg:
            raise FormatError(
                f"{companion_name(split, size, c, build)} has {arrays[c].size} entries, expected {n_seg}, {d}, re-run `packtool pack`"
            )
    if loss is not None and loss.shape != tokens.shape:
        raise FormatError(f"{lname} has shape {loss.shape}, expected {tokens.shape}, {d}, re-run `packtool pack`")
    check_metadata_numbers(meta, size, n_packs, n_seg, tokens.dtype, where)
    vision = {c: arrays[c] for c in VISION_COMPANIONS} if with_vision else None
    if vision is not None:
        check_vision_arrays(vision, n_packs, size, where)
    if check_hashes and build is not None:
        _check_alias(d, split, size, build, meta)
    return PackSplit(
        d,
        split,
        size,
        meta,
        tokens,
        po,
        arrays["seg_lens"],
        arrays["seg_pad"],
        arrays["seg_doc"],
        arrays["seg_src"],
        loss,
        build,
        arrays.get("seg_pair"),
        arrays.get("seg_role"),
        vision,
    )


def _check_alias(d: Path, split: str, size: int, build: str, meta: dict[str, Any]) -> None:
    """The plain `{S}_{N}.npy`, when present, must hold the build's data (a hard link, or equal bytes)."""
    alias, target = d / data_name(split, size), d / data_name(split, size, build)
    if not alias.exists() or os.path.samefile(alias, target):
        return
    record = meta["files"][target.name]
    if alias.stat().st_size != record["bytes"] or sha256_file(alias) != record["sha256"]:
        raise FormatError(
            f"{alias.name} is not the data of the committed build {build} (left by an interrupted run), {alias}, "
            "re-run `packtool pack` or delete it (packtool reads the build's files)"
        )


def find_pack_dir(path: str | os.PathLike[str]) -> Path:
    """Resolve a `packed/{tokenizer}` dir from itself, a pack ROOT holding one tokenizer, or a `.npy` file."""
    p = Path(path)
    if p.is_file():
        if parse_data_name(p.name) is None:
            raise FormatError(
                f"{p} is neither a token store nor a pack file ({{split}}_{{N}}.npy), "
                "pass a token store directory, a pack ROOT, a packed/{tokenizer} directory or a pack .npy"
            )
        return p.parent
    if any(p.glob("*_metadata.jsonl")):
        return p
    packed = p / "packed"
    subdirs = sorted(x for x in packed.iterdir() if x.is_dir()) if packed.is_dir() else []
    if len(subdirs) == 1:
        return subdirs[0]
    if len(subdirs) > 1:
        raise FormatError(f"{packed} holds several tokenizers ({', '.join(s.name for s in subdirs)}), pass one of them")
    if is_token_store(p):  # "no manifest.json" would be false: it is the wrong kind of store
        raise FormatError(
            f"{p} is a token store, not a pack store, pass a pack ROOT, a packed/{{tokenizer}} directory or a "
            "pack .npy (run `packtool pack` on the token store first)"
        )
    raise FormatError(
        f"no token store or pack store at {p} (no manifest.json, no *_metadata.jsonl), "
        "check the path, or run `packtool tokenize` / `packtool pack` first"
    )


def sizes_in(directory: Path) -> list[int]:
    out = []
    for f in Path(directory).glob("*_metadata.jsonl"):
        head = f.name.split("_", 1)[0]
        if head.isdigit():
            out.append(int(head))
    return sorted(out)
