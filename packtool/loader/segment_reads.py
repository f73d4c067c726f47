"""The segment lengths of chosen packs of a pack store, read in place from its CSR companions.

A balanced sampler over a blend prices every window it deals (`CostModel` needs each pack's segment lengths):
a window of 1,000 ranks x 128 steps draws from nearly every store of a 10,000-store blend. Opening each store
for that (every format check, nine memory maps, each holding a file descriptor) cost 17-58 s per window on
the project VM. Pricing needs two small arrays only, `pack_offsets` and `seg_lens`: this reads their `.npy`
headers once per store (a few numbers kept) and then, per window, the few entries of the packs it prices,
through a map opened and closed within the call (no descriptor kept). Nothing read here feeds a training
batch: the packs themselves are read through the store's full open, every check included.
"""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_store import companion_name

_PLAIN_HEADER = 256
#: the header `np.save` writes for a 1-D integer array (format 1.0): parsed without numpy's literal_eval, which
#: took a third of pricing a 10,000-store window
_PLAIN = re.compile(
    rb"\x93NUMPY\x01\x00..\{'descr': '([<>|][iu][1248])', 'fortran_order': False, 'shape': \((\d+),\), \} *\n",
    re.DOTALL,
)


@dataclass(frozen=True)
class _Array:
    """Where a 1-D `.npy` array's data lies: its file, data offset, dtype and length."""

    path: str
    offset: int
    dtype: np.dtype
    length: int


def _header(path: Path) -> _Array:
    """The data layout of a 1-D little- or big-endian integer `.npy` file, from its header only."""
    shape: tuple[int, ...]
    try:
        with open(path, "rb") as fh:
            head = fh.read(_PLAIN_HEADER)
            end = head.find(b"\n", 10) + 1  # the header's end (its length bytes may hold a newline)
            plain = _PLAIN.fullmatch(head[:end]) if end else None
            if plain is not None and 10 + int.from_bytes(head[8:10], "little") == end:
                shape, fortran, dtype = (int(plain.group(2)),), False, np.dtype(plain.group(1).decode())
                offset = end
            else:  # any other header (another writer, another version): numpy's own reader
                fh.seek(0)
                version = np.lib.format.read_magic(fh)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
                else:
                    raise ValueError(f"npy format version {version[0]}.{version[1]}")
                offset = fh.tell()
            size = os.fstat(fh.fileno()).st_size
    except FileNotFoundError:
        raise FormatError(
            f"{path.name} is missing, {path.parent}, re-open the blend (or re-run `packtool pack`)"
        ) from None
    except (ValueError, OSError, EOFError) as exc:
        raise FormatError(
            f"{path.name} is not a readable .npy ({exc}; truncated or corrupted), {path}, re-run `packtool pack`"
        ) from exc
    if len(shape) != 1 or fortran or dtype.kind not in "iu" or dtype.hasobject:
        raise FormatError(
            f"{path.name} has dtype {dtype} and shape {shape}, expected 1-D integers, {path}, re-run `packtool pack`"
        )
    if size < offset + shape[0] * dtype.itemsize:
        raise FormatError(
            f"{path.name} is truncated ({size} bytes for {shape[0]} entries), {path}, re-run `packtool pack`"
        )
    return _Array(str(path), offset, dtype, int(shape[0]))


class SegmentReads:
    """`lengths(s, packs)`: the segment lengths of packs `packs` of store s of a blend (module docstring)."""

    def __init__(self, directories: list[Path], split: str, size: int, builds: list[str | None], n_packs: np.ndarray):
        self._dirs, self._split, self._size, self._builds = directories, split, int(size), builds
        self._n_packs = n_packs
        self._arrays: dict[int, tuple[_Array, _Array]] = {}

    def _layout(self, s: int) -> tuple[_Array, _Array]:
        found = self._arrays.get(s)
        if found is None:
            d, build = self._dirs[s], self._builds[s]
            po = _header(d / companion_name(self._split, self._size, "pack_offsets", build))
            lens = _header(d / companion_name(self._split, self._size, "seg_lens", build))
            if po.length != int(self._n_packs[s]) + 1:
                raise FormatError(
                    f"store {d} now holds {po.length - 1} packs, the blend was opened with {int(self._n_packs[s])}, "
                    "BlendedDataset, re-open the blend"
                )
            found = self._arrays[s] = (po, lens)
        return found

    def lengths(self, s: int, packs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(counts, lens)`: each pack's number of segments, and their lengths in pack order (int64)."""
        po, lens = self._layout(s)
        packs = np.asarray(packs, np.int64)
        if packs.size and (int(packs.min()) < 0 or int(packs.max()) >= po.length - 1):
            raise ConfigError(
                f"packs outside 0..{po.length - 2} of store {self._dirs[s]}, BlendedDataset.segment_lengths, "
                "pass pack indices of that store"
            )
        both = _gather(po, np.concatenate((packs, packs + 1)))
        starts, ends = both[: packs.size], both[packs.size :]
        counts = ends - starts
        _, first = np.unique(packs, return_index=True)  # distinct packs of a sound table hold distinct segments
        if packs.size and (
            bool((counts < 0).any())
            or int(starts.min()) < 0
            or int(ends.max()) > lens.length
            or int(counts[first].sum()) > lens.length  # bounds what is allocated below
        ):
            raise FormatError(
                f"pack_offsets is inconsistent with {lens.length} segments, {self._dirs[s]}, re-run `packtool pack`"
            )
        bounds = np.concatenate(([0], np.cumsum(counts)))
        idx = np.arange(int(bounds[-1]), dtype=np.int64) + np.repeat(starts - bounds[:-1], counts)
        return counts, _gather(lens, idx)


def _gather(array: _Array, index: np.ndarray) -> np.ndarray:
    """`array[index]` as int64 (`index` in range), read through a map that is closed before this returns."""
    try:
        with open(array.path, "rb") as fh:
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise FormatError(f"{Path(array.path).name} is missing, {array.path}, re-open the blend") from None
    except (OSError, ValueError) as exc:
        raise FormatError(f"cannot map {Path(array.path).name} ({exc}), {array.path}, re-run `packtool pack`") from exc
    try:
        if len(mm) < array.offset + array.length * array.dtype.itemsize:
            raise FormatError(f"{Path(array.path).name} is truncated, {array.path}, re-run `packtool pack`")
        view = np.frombuffer(mm, dtype=array.dtype, count=array.length, offset=array.offset)
        out = view[index].astype(np.int64)
        del view
    finally:
        mm.close()
    return out
