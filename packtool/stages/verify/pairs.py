"""Verify a preference split: every pair packed whole, in one pack, exactly as often as it must be.

Without a source: each pair's segments are consecutive in one pack, in their layout's role order
([chosen][rejected] or [prompt][chosen completion][rejected completion]), of one pair, on the pair's
documents (chosen even, rejected odd, `seg_pair = seg_doc // 2`), a completion continuing its prompt's
tokens, and the metadata's pair counts equal the arrays'. With `--source`: the pack stage's pair items
are re-derived from the source (shared prompt length, over-long policy) and every packed pair must be
its expected item, `occurrences` times (once without a mixture); the token comparison of `packs.py`
then proves both sequences, and the shared prompt, identical to the source.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packtool.choices import Overlong
from packtool.core.packing.pairs import build_pair_items, pair_scan
from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_store import (
    ROLE_CHOSEN,
    ROLE_CHOSEN_COMPLETION,
    ROLE_NAMES,
    ROLE_PROMPT,
    ROLE_REJECTED,
    ROLE_REJECTED_COMPLETION,
    PackSplit,
    metadata_name,
)
from packtool.formats.store_set import StoreSet

_REPACK = "re-run `packtool pack`"
_NEXT = {
    ROLE_CHOSEN: ROLE_REJECTED,
    ROLE_PROMPT: ROLE_CHOSEN_COMPLETION,
    ROLE_CHOSEN_COMPLETION: ROLE_REJECTED_COMPLETION,
}


def _fail(ps: PackSplit, role: str, what: str) -> FormatError:
    return FormatError(f"{what}, {ps.directory / ps.file_name(role)}, {_REPACK}")


def _meta_fail(ps: PackSplit, what: str) -> FormatError:
    return FormatError(f"{what}, {ps.directory / metadata_name(ps.size)}, {_REPACK}")


def check_pairs(
    ps: PackSplit, po: np.ndarray, stores: StoreSet | None = None, occurrences: np.ndarray | None = None
) -> tuple[int, str]:
    """All pair checks of one preference split; returns (pairs packed, layout). `occurrences` counts DOCUMENTS."""
    pref: dict[str, Any] = ps.preference or {}
    shared = ps.shared_prompt
    if ps.seg_pair is None or ps.seg_role is None:
        raise _meta_fail(ps, "metadata names a preference split but seg_pair/seg_role are not there")
    pair = np.asarray(ps.seg_pair, np.int64)
    role = np.asarray(ps.seg_role, np.int64)
    doc = np.asarray(ps.seg_doc, np.int64)
    src = np.asarray(ps.seg_src, np.int64)
    real = np.asarray(ps.seg_lens, np.int64) - np.asarray(ps.seg_pad, np.int64)
    n = int(role.size)
    allowed = [ROLE_CHOSEN, ROLE_REJECTED] + (
        [ROLE_PROMPT, ROLE_CHOSEN_COMPLETION, ROLE_REJECTED_COMPLETION] if shared else []
    )
    bad = ~np.isin(role, allowed)
    if bad.any():
        j = int(np.argmax(bad))
        raise _fail(
            ps,
            "seg_role",
            f"segment {j} has role {int(role[j])}, expected one of {allowed} (layout {pref.get('layout')})",
        )
    rejected_side = (role == ROLE_REJECTED) | (role == ROLE_REJECTED_COMPLETION)
    bad = (pair != doc // 2) | ((doc % 2 == 1) != rejected_side)
    if bad.any():
        j = int(np.argmax(bad))
        raise _fail(
            ps,
            "seg_pair",
            f"segment {j} ({ROLE_NAMES[int(role[j])]}) names pair {int(pair[j])} and document {int(doc[j])}, "
            "expected pair = document // 2, the chosen sequence on the even document and the rejected on the odd",
        )
    seg_pack = np.repeat(np.arange(po.size - 1, dtype=np.int64), np.diff(po))
    # every segment but a pair's first continues the one before it: next role, same pair, same pack
    follows = np.zeros(n, bool)
    if n > 1:
        prev, cur = role[:-1], role[1:]
        want = np.full(prev.size, -1)
        for a, b in _NEXT.items():
            want[prev == a] = b
        follows[1:] = (cur == want) & (pair[1:] == pair[:-1]) & (seg_pack[1:] == seg_pack[:-1])
    first = (role == ROLE_CHOSEN) | (role == ROLE_PROMPT)
    bad = first == follows  # a first segment that continues, or a later one that does not
    last = (role == ROLE_REJECTED) | (role == ROLE_REJECTED_COMPLETION)
    ends_ok = np.zeros(n, bool)
    ends_ok[:-1] = follows[1:]
    bad |= ~last & ~ends_ok  # a pair cut short (by the pack's end or another pair)
    if bad.any():
        j = int(np.argmax(bad))
        raise _fail(
            ps,
            "seg_role",
            f"pack {int(seg_pack[j])} segment {j} ({ROLE_NAMES[int(role[j])]} of pair {int(pair[j])}) is not where "
            "its pair's other segments are: a pair must be consecutive segments of one pack, "
            + ("[prompt][chosen completion][rejected completion] or " if shared else "")
            + "[chosen][rejected] (a split, duplicated or mixed-up pair)",
        )
    comp = np.flatnonzero(role == ROLE_CHOSEN_COMPLETION)  # (`follows` put its prompt right before it)
    bad_c = (src[comp] != src[comp - 1] + real[comp - 1]) | (doc[comp] != doc[comp - 1])
    if bad_c.any():
        j = int(comp[np.argmax(bad_c)])
        raise _fail(
            ps,
            "seg_src",
            f"segment {j} (chosen completion of pair {int(pair[j])}) starts at token {int(src[j])}, expected right "
            f"after its prompt segment (token {int(src[j - 1] + real[j - 1])} of the same document)",
        )
    starts = np.flatnonzero(first)
    groups = pair[starts]
    packed = int(starts.size)
    for key, value in (("n_packed_pairs", packed),):
        if int(pref.get(key, -1)) != value:
            raise _meta_fail(ps, f"metadata preference.{key} is {pref.get(key)!r} but the arrays hold {value} pairs")
    if stores is None:
        if not isinstance(ps.metadata.get("mixture"), dict) and groups.size:
            counts = np.bincount(groups)
            if int(counts.max()) > 1:
                q = int(np.argmax(counts))
                raise _fail(ps, "seg_pair", f"pair {q} is packed {int(counts[q])} times, expected once")
        return packed, str(pref.get("layout"))
    _check_source(ps, stores, occurrences, pref, groups, starts, role, src, real)
    return packed, str(pref.get("layout"))


def _check_source(
    ps: PackSplit,
    stores: StoreSet,
    occurrences: np.ndarray | None,
    pref: dict[str, Any],
    groups: np.ndarray,
    starts: np.ndarray,
    role: np.ndarray,
    src: np.ndarray,
    real: np.ndarray,
) -> None:
    """Every pair as the pack stage makes it from the source, as often as the split holds it."""
    meta = ps.metadata
    n_pairs = stores.n_documents // 2
    mult = np.ones(n_pairs, np.int64) if occurrences is None else np.asarray(occurrences, np.int64)[0::2]
    if int(pref.get("pairs", -1)) != int(mult.sum()):
        raise _meta_fail(ps, f"metadata preference.pairs is {pref.get('pairs')!r}, the source gives {int(mult.sum())}")
    try:
        policy = Overlong(str((pref.get("overlong") or {}).get("policy", "split")))
        scan = np.concatenate([pair_scan(s.tokens, s.loss, s.starts, s.lengths) for s in stores.stores], axis=1)
        pairs = np.repeat(np.arange(n_pairs, dtype=np.int64), mult)
        want = build_pair_items(
            pairs,
            stores.starts,
            stores.lengths,
            scan,
            ps.size,
            policy,
            int(meta.get("pad_multiple") or 1),
            ps.shared_prompt,
        )
    except (ValueError, ConfigError) as exc:
        raise _meta_fail(ps, f"the source does not pack as the metadata says ({exc})") from exc
    overlong = pref.get("overlong") or {}
    for key, got, value in (
        ("overlong.count", overlong.get("count"), want.n_overlong),
        ("overlong.truncated", overlong.get("truncated"), want.n_truncated),
        ("overlong.dropped", overlong.get("dropped"), want.n_dropped),
        ("n_empty_pairs", pref.get("n_empty_pairs"), want.n_empty),
        ("prompt_tokens_saved", pref.get("prompt_tokens_saved"), want.n_prompt_tokens_saved),
    ):
        if got != value:
            raise _meta_fail(ps, f"metadata preference.{key} is {got!r}, the source gives {value}")
    # the expected item of each pair (repeats of a pair are identical: keep the first)
    first_item = np.full(n_pairs, -1, np.int64)
    order = np.arange(want.pair.size - 1, -1, -1)
    first_item[want.pair[order]] = order
    expect_count = np.bincount(want.pair, minlength=n_pairs)
    got_count = np.bincount(groups, minlength=n_pairs) if groups.size else np.zeros(n_pairs, np.int64)
    if got_count.size > n_pairs:
        q = int(np.flatnonzero(got_count[n_pairs:])[0]) + n_pairs
        raise _fail(ps, "seg_pair", f"pair {q} is packed, the source holds pairs 0..{n_pairs - 1}")
    bad = got_count != expect_count
    if bad.any():
        q = int(np.argmax(bad))
        raise _fail(
            ps,
            "seg_pair",
            f"pair {q} is packed {int(got_count[q])} times, expected {int(expect_count[q])} "
            f"(--overlong {policy}; a missing, duplicated or dropped pair)",
        )
    # each packed pair's segments equal its expected item's (roles, token offsets, lengths)
    item = first_item[groups]
    n_seg = np.diff(want.item_offsets)[item]
    got_n = np.diff(np.append(starts, role.size))
    bad = n_seg != got_n
    if not bad.any():
        ramp = np.arange(int(n_seg.sum()), dtype=np.int64) - np.repeat(np.cumsum(n_seg) - n_seg, n_seg)
        e = np.repeat(want.item_offsets[:-1][item], n_seg) + ramp
        g = np.repeat(starts, n_seg) + ramp
        seg_bad = (want.role[e] != role[g]) | (want.src[e] != src[g]) | (want.real[e] != real[g])
        if seg_bad.any():
            k = int(np.argmax(seg_bad))
            j, x = int(g[k]), int(e[k])
            q = int(want.pair[np.searchsorted(want.item_offsets, x, side="right") - 1])
            raise _fail(
                ps,
                "seg_src",
                f"segment {j} ({ROLE_NAMES[int(role[j])]} of pair {q}) holds {int(real[j])} tokens from offset "
                f"{int(src[j])}, the source gives {ROLE_NAMES[int(want.role[x])]} of {int(want.real[x])} tokens from "
                f"{int(want.src[x])} (a wrong shared prompt, a truncated or a foreign sequence)",
            )
        return
    i = int(np.argmax(bad))
    raise _fail(
        ps,
        "seg_role",
        f"pair {int(groups[i])} is packed as {int(got_n[i])} segments, the source gives {int(n_seg[i])}",
    )
