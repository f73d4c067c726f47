"""Verify one (split, size) of a pack store: geometry from the CSR companions, padding, ids, and
with a source token store, that every document is packed exactly once with identical tokens and loss.

Vectorised and block-wise (`BLOCK_TOKENS` positions at a time); the first failure raises a
FormatError naming the file, the first offending pack / segment / document, expected vs got, and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.choices import Overlong
from packtool.core.packing.segments import expand_runs, usable_capacity
from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_store import PackSplit, metadata_name
from packtool.formats.store_set import StoreSet
from packtool.formats.token_store import TOKEN_DTYPES, TokenStore
from packtool.progress import Progress
from packtool.stages.verify.pack_images import check_vision_coverage, verify_pack_images
from packtool.stages.verify.pairs import check_pairs
from packtool.stages.verify.tokens import BLOCK_TOKENS

_REPACK = "re-run `packtool pack`"


@dataclass(frozen=True)
class _Geometry:
    """Per-segment and per-pack numbers derived from the CSR companions (all int64)."""

    po: np.ndarray  # [n_packs + 1]
    lens: np.ndarray
    pad: np.ndarray
    real: np.ndarray
    used: np.ndarray  # [n_packs] positions taken by segments
    dst: np.ndarray  # flat position (pack * N + column) of each segment's first token


def _fail(ps: PackSplit, fname: str, what: str, fix: str = _REPACK) -> FormatError:
    return FormatError(f"{what}, {ps.directory / fname}, {fix}")


def _pack_of(po: np.ndarray, seg: int) -> int:
    return int(np.searchsorted(po, seg, side="right")) - 1


def _geometry(ps: PackSplit) -> _Geometry:
    """Segment checks that need no token data: lengths, padding, capacity, pack counts."""
    size, meta = ps.size, ps.metadata
    po = np.asarray(ps.pack_offsets, np.int64)
    lens = np.asarray(ps.seg_lens, np.int64)
    pad = np.asarray(ps.seg_pad, np.int64)
    real = lens - pad
    name = ps.file_name
    multiple = int(meta.get("pad_multiple") or 1)
    bad = (pad < 0) | (real < 1) | (lens % multiple != 0)
    if bad.any():
        j = int(np.argmax(bad))
        raise _fail(
            ps,
            name("seg_pad"),
            f"segment {j} (pack {_pack_of(po, j)}) has length {int(lens[j])} with {int(pad[j])} "
            f"--pad-multiple padding, expected 0 <= padding < length and length a multiple of {multiple}",
        )
    ends = np.concatenate(([0], np.cumsum(lens)))
    used = ends[po[1:]] - ends[po[:-1]]
    per_pack = np.diff(po)
    bad_pack = (used > size) | (per_pack == 0)
    if bad_pack.any():
        p = int(np.argmax(bad_pack))
        raise _fail(
            ps,
            name("seg_lens"),
            f"pack {p} holds {int(per_pack[p])} segments of {int(used[p])} tokens in all, "
            f"expected 1 or more segments of at most {size} tokens",
        )
    cap = meta.get("max_docs_per_pack")
    if isinstance(cap, int) and per_pack.size and int(per_pack.max()) > cap:
        p = int(np.argmax(per_pack > cap))
        raise _fail(
            ps,
            name("pack_offsets"),
            f"pack {p} holds {int(per_pack[p])} segments, expected at most max_docs_per_pack={cap}",
        )
    within = ends[:-1] - np.repeat(ends[po[:-1]], per_pack)
    dst = np.repeat(np.arange(per_pack.size, dtype=np.int64) * size, per_pack) + within
    return _Geometry(po, lens, pad, real, used, dst)


def _check_counts(ps: PackSplit, g: _Geometry) -> None:
    """The metadata's counts and dtype must be the arrays' (a stale or hand-edited line is caught here)."""
    meta, size = ps.metadata, ps.size
    n_tokens = int(g.real.sum())
    got = {
        "pack_size": size,
        "n_packs": ps.n_packs,
        "n_segments": int(g.lens.size),
        "n_tokens": n_tokens,
        "n_pad_tokens": ps.n_packs * size - n_tokens,
    }
    for key, value in got.items():
        if key not in meta or int(meta[key]) != value:
            raise FormatError(
                f"metadata {key} of split {ps.split!r} is {meta.get(key)!r} but the arrays give {value}, "
                f"{ps.directory / metadata_name(size)}, {_REPACK}"
            )


def _check_dtype(ps: PackSplit) -> np.dtype:
    name = ps.metadata.get("dtype")
    expected = TOKEN_DTYPES.get(str(name))
    if expected is None:
        raise _fail(
            ps,
            metadata_name(ps.size),
            f"metadata dtype {name!r} of split {ps.split!r} is unknown, expected uint16 or uint32",
        )
    if ps.tokens.dtype != expected:
        raise _fail(
            ps,
            ps.file_name(),
            f"{ps.file_name()} has dtype {ps.tokens.dtype.str}, expected {expected.str} ({name}, as the metadata says)",
        )
    return expected


# ---------------------------------------------------------------- pack store: source coverage


def _check_coverage(ps: PackSplit, g: _Geometry, stores: StoreSet, mult: np.ndarray | None = None) -> None:
    """Every source document `mult[d]` times (1 without a mixture), each time as its fragments from its start
    covering what the overlong policy keeps; the metadata's document counts are the occurrences'."""
    meta, size = ps.metadata, ps.size
    doc, src = np.asarray(ps.seg_doc, np.int64), np.asarray(ps.seg_src, np.int64)
    n_docs, lengths, starts = stores.n_documents, stores.lengths, stores.starts
    mult = np.ones(n_docs, np.int64) if mult is None else np.asarray(mult, np.int64)
    fname = ps.file_name("seg_doc")
    if int(meta.get("n_documents", -1)) != int(mult.sum()):
        raise _fail(
            ps,
            metadata_name(size),
            f"metadata n_documents is {meta.get('n_documents')!r}, the source"
            + (f" has {n_docs}" if n_docs == int(mult.sum()) else f"s give {int(mult.sum())} document occurrences"),
        )
    bad = (doc < 0) | (doc >= n_docs)
    if bad.any():
        j = int(np.argmax(bad))
        raise _fail(ps, fname, f"segment {j} names document {int(doc[j])}, expected 0..{n_docs - 1}")
    try:
        policy = Overlong(str((meta.get("overlong") or {}).get("policy", "split")))
        cap = usable_capacity(size, int(meta.get("pad_multiple") or 1))
    except (ValueError, ConfigError) as exc:
        raise _fail(ps, metadata_name(size), f"metadata overlong policy or pad_multiple is invalid ({exc})") from exc
    long_docs = lengths > cap
    expect = {
        "overlong count": (int((meta.get("overlong") or {}).get("count", -1)), int(mult[long_docs].sum())),
        "n_empty_documents": (int(meta.get("n_empty_documents", -1)), int(mult[lengths == 0].sum())),
    }
    for key, (got_v, want) in expect.items():
        if got_v != want:
            raise _fail(ps, metadata_name(size), f"metadata {key} is {got_v}, the source gives {want}")
    if policy is Overlong.SPLIT:
        keep = lengths
    elif policy is Overlong.DROP:
        keep = np.where(long_docs, 0, lengths)
    else:  # truncate (and error, where no document is over-long)
        keep = np.minimum(lengths, cap)
    # each segment must be one of its document's fragments: at k * cap from the start, min(cap, rest) tokens
    off = src - starts[doc]
    rest = keep[doc] - off
    if policy is Overlong.SPLIT:
        valid = (off >= 0) & (off % cap == 0) & (rest > 0) & (g.real == np.minimum(cap, rest))
        n_frag = -(-keep // cap)
    else:
        valid = (off == 0) & (rest > 0) & (g.real == rest)
        n_frag = (keep > 0).astype(np.int64)
    if not valid.all():
        j = int(np.argmax(~valid))
        dd = int(doc[j])
        raise _fail(
            ps,
            ps.file_name("seg_src"),
            f"document {dd}: segment {j} (pack {_pack_of(g.po, j)}) holds tokens {int(off[j])}..{int(off[j] + g.real[j])} "
            f"of its {int(lengths[dd])}, expected a fragment starting at a multiple of {cap} and running to "
            f"min(+{cap}, {int(keep[dd])}) (--overlong {policy}; duplicated, overlapping or missing fragment)",
        )
    # each fragment exactly mult[d] times: then the fragments of every occurrence are all there
    order = np.lexsort((off, doc))
    d, o = doc[order], off[order]
    new_run = np.ones(d.size, bool)
    new_run[1:] = (d[1:] != d[:-1]) | (o[1:] != o[:-1])
    run_start = np.flatnonzero(new_run)
    run_count = np.diff(np.append(run_start, d.size))
    bad_run = run_count != mult[d[run_start]]
    if bad_run.any():
        r = int(np.argmax(bad_run))
        dd, j = int(d[run_start[r]]), int(order[run_start[r]])
        raise _fail(
            ps,
            ps.file_name("seg_src"),
            f"document {dd}: its fragment at token {int(o[run_start[r]])} is packed {int(run_count[r])} times "
            f"(segment {j}, pack {_pack_of(g.po, j)}), expected {int(mult[dd])} (duplicated or missing fragment)",
        )
    per_doc = np.bincount(doc, minlength=n_docs)
    bad = per_doc != mult * n_frag
    if bad.any():
        dd = int(np.argmax(bad))
        raise _fail(
            ps,
            fname,
            f"document {dd} ({int(lengths[dd])} tokens, --overlong {policy}) is covered by {int(per_doc[dd])} "
            f"segments, expected {int(n_frag[dd])} fragment(s) x {int(mult[dd])} occurrence(s) (missing document)",
        )


# ---------------------------------------------------------------- pack store: token data, block by block


def _check_block(ps: PackSplit, g: _Geometry, p0: int, p1: int, pad_id: int, store: StoreSet | None) -> None:
    """Packs [p0, p1): padding is the pad id (loss 0), loss bits in {0,1}, and with a source identical tokens."""
    size = ps.size
    blk = np.asarray(ps.tokens[p0:p1]).reshape(-1)
    s0, s1 = int(g.po[p0]), int(g.po[p1])
    base = p0 * size
    mask = (np.arange(size)[None, :] >= g.used[p0:p1, None]).reshape(-1)  # tail padding
    (pads,) = expand_runs(g.pad[s0:s1], g.dst[s0:s1] + g.real[s0:s1] - base)
    mask[pads] = True  # --pad-multiple padding
    bad = mask & (blk != pad_id)
    if bad.any():
        k = int(np.argmax(bad))
        p, c = p0 + k // size, k % size
        where = "tail padding" if c >= g.used[p] else "--pad-multiple padding"
        raise _fail(
            ps,
            ps.file_name(),
            f"pack {p} column {c} ({where}) holds id {int(blk[k])}, expected the pad id {pad_id}",
        )
    loss = None if ps.loss is None else np.asarray(ps.loss[p0:p1]).reshape(-1)
    if loss is not None:
        bad = (loss > 1) | (mask & (loss != 0))
        if bad.any():
            k = int(np.argmax(bad))
            p, c = p0 + k // size, k % size
            raise _fail(
                ps,
                ps.file_name("loss"),
                f"pack {p} column {c} holds loss {int(loss[k])}, expected " + ("0 (padding)" if mask[k] else "0 or 1"),
            )
    if store is None:
        return
    run_begin = np.cumsum(g.real[s0:s1]) - g.real[s0:s1]
    src_idx, dst_idx = expand_runs(g.real[s0:s1], np.asarray(ps.seg_src[s0:s1], np.int64), g.dst[s0:s1] - base)
    for what, packed, source, fname in (
        ("token", blk, "tokens", ps.file_name()),
        ("loss bit", loss, "loss", ps.file_name("loss")),
    ):
        if packed is None:
            continue  # no loss matrix (the source has none either: checked before)
        got = packed[dst_idx]
        want = store.gather(src_idx, source)  # a store without tokens.loss: all targets
        diff = got != want
        if diff.any():
            k = int(np.argmax(diff))
            j = s0 + int(np.searchsorted(run_begin, k, side="right")) - 1
            doc, t = int(ps.seg_doc[j]), int(src_idx[k])
            pos = t - int(store.starts[doc])
            s_i = int(store.store_of_docs(np.asarray([doc]))[0])
            local = f"document {doc - int(store.doc_offsets[s_i])}" if len(store.stores) > 1 else f"document {doc}"
            t_local = t - int(store.token_offsets[s_i])
            raise _fail(
                ps,
                fname,
                f"pack {_pack_of(g.po, j)} segment {j} ({local}, its token {pos}, tokens.bin offset {t_local}) "
                f"holds {what} {int(got[k])}, the source {store.stores[s_i].path} has {int(want[k])}",
            )


def verify_pack_split(
    ps: PackSplit,
    store: StoreSet | TokenStore | None,
    progress: Progress | None = None,
    occurrences: np.ndarray | None = None,
) -> str:
    """All checks of one split at one size (opened with hashes checked); returns a one-line summary.

    `store`: the source token store, or a mixture's sources in metadata order; `occurrences`: how many
    times each (global) document must be packed (None: once each).
    """
    if store is not None:
        store = StoreSet.of(store)
    _check_dtype(ps)
    g = _geometry(ps)
    _check_counts(ps, g)
    pad_id = ps.metadata.get("pad_id")
    if not isinstance(pad_id, int) or pad_id < 0 or pad_id > int(np.iinfo(ps.tokens.dtype).max):
        raise _fail(
            ps, metadata_name(ps.size), f"metadata pad_id {pad_id!r} is not a token id of dtype {ps.tokens.dtype.name}"
        )
    if store is not None:
        if store.has_loss != (ps.loss is not None):
            raise _fail(
                ps,
                ps.file_name("loss"),
                f"the source {'has' if store.has_loss else 'has no'} tokens.loss "
                f"but the packs {'have' if ps.loss is not None else 'have no'} a loss matrix",
            )
        if store.dtype != ps.tokens.dtype:
            raise _fail(ps, ps.file_name(), f"packs are {ps.tokens.dtype.name}, the source is {store.dtype.name}")
        if ps.preference is None and ps.images is None:
            _check_coverage(ps, g, store, occurrences)
        elif ps.preference is None:  # a vision split cuts at text only (`pack_images.check_vision_coverage`)
            check_vision_coverage(ps, g.real, store, occurrences)
    pairs = None
    if ps.preference is not None:  # pairs: whole, in one pack, as often as they must be (replaces coverage)
        pairs = check_pairs(ps, g.po, store, occurrences)
    rows = max(1, BLOCK_TOKENS // ps.size)
    for p0 in range(0, ps.n_packs, rows):
        p1 = min(ps.n_packs, p0 + rows)
        _check_block(ps, g, p0, p1, pad_id, store)
        if progress is not None:
            progress(p1 * ps.size, ps.n_packs * ps.size)
    line = f"{ps.split}_{ps.size}: {ps.n_packs} packs, {g.lens.size} segments, {int(g.real.sum())} tokens"
    images = verify_pack_images(ps, g.lens, g.dst, store)  # '' for a text-only split
    line += f", {images}" if images else ""
    if pairs is not None:
        line += f", {pairs[0]} pairs ({pairs[1]}) each whole in one pack"
    return line
