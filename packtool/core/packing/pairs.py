"""Preference pairs -> pair items: what `pack` places when the token store holds (chosen, rejected) pairs.

A pair is ONE packing item, so both of its sequences always land in the same pack (pair-atomic):
- `pairs` layout: two segments `[chosen][rejected]`, each a whole sequence (length chosen + rejected);
- `shared-prompt` layout: three segments `[prompt][chosen completion][rejected completion]`, the prompt
  held once (length p + c + r). The shared prompt length is
  `min(first target(chosen), first target(rejected), common prefix(chosen, rejected))` (the contract with
  `tokenize --format preference`), clamped so that each completion keeps at least one token: a zero-length
  segment would be an edge case for every varlen kernel, and the last prompt token moved into both
  completions changes neither the attention nor the positions. A pair whose shared prompt is then empty
  (a sequence of one token) is packed as two whole sequences, in either layout.

Over-long pairs (item longer than the pack): `error` and `split` refuse (a pair cannot be split across
packs: its two log-probs come from one forward), `drop` drops the pair, `truncate` cuts BOTH sequences to
one common length L, the largest that fits the pair (what TRL's `max_length=L` with `truncation_mode=
"keep_start"` does to each sequence), and drops the pair instead when a sequence would keep none of its
target tokens. Pairs with an empty sequence hold no forward and are never packed (counted).

Everything is vectorised over pairs; the one per-token pass (first target, common prefix) is compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from packtool.choices import Overlong
from packtool.errors import ConfigError
from packtool.formats.pack_store import (
    ROLE_CHOSEN,
    ROLE_CHOSEN_COMPLETION,
    ROLE_PROMPT,
    ROLE_REJECTED,
    ROLE_REJECTED_COMPLETION,
)


@njit(cache=True, nogil=True)
def _scan(
    tokens: np.ndarray, loss: np.ndarray, has_loss: bool, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray
) -> None:
    """Per pair q (documents 2q, 2q+1): first target of each sequence and their common prefix."""
    for q in range(starts.size // 2):
        for k in range(2):
            d = 2 * q + k
            s, n = starts[d], lengths[d]
            ft = n
            if has_loss:
                for j in range(n):
                    if loss[s + j] != 0:
                        ft = j
                        break
            else:
                ft = 0
            out[k, q] = ft
        a, b = starts[2 * q], starts[2 * q + 1]
        m = min(lengths[2 * q], lengths[2 * q + 1])
        c = 0
        while c < m and tokens[a + c] == tokens[b + c]:
            c += 1
        out[2, q] = c


def pair_scan(tokens: np.ndarray, loss: np.ndarray | None, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """int64 `[3, n_pairs]`: first target of the chosen, of the rejected sequence (its length when it has none;
    0 for a store without `tokens.loss`, where every token is a target) and their common prefix length."""
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    out = np.zeros((3, starts.size // 2), np.int64)
    flags = np.zeros(0, np.uint8) if loss is None else loss
    _scan(tokens, flags, loss is not None, starts, lengths, out)
    return out


def shared_prompt_lengths(scan: np.ndarray, len_c: np.ndarray, len_r: np.ndarray) -> np.ndarray:
    """Shared prompt p of each pair (of sequences of lengths `len_c`, `len_r`): the contract's
    `min(first targets, common prefix)`, clamped to leave each completion one token (0: no shared prompt)."""
    p = np.minimum(np.minimum(scan[0], scan[1]), scan[2])
    return np.maximum(0, np.minimum(p, np.minimum(len_c, len_r) - 1))


@dataclass(frozen=True)
class PairItems:
    """Pair items in input order and their segments (CSR: item i owns `item_offsets[i]:item_offsets[i+1]`)."""

    pair: np.ndarray  # int64 [n_items] global pair index (chosen document = 2 * pair)
    item_offsets: np.ndarray  # int64 [n_items + 1]
    doc: np.ndarray  # int64 [n_segments] global document
    src: np.ndarray  # int64 [n_segments] global token offset of the segment's first token
    real: np.ndarray  # int64 [n_segments]
    pad: np.ndarray  # int64 [n_segments] --pad-multiple padding (pairs layout only)
    role: np.ndarray  # uint8 [n_segments] ROLE_*
    n_pairs: int  # pairs given (occurrences)
    n_overlong: int  # pairs longer than the pack (whatever the policy did)
    n_truncated: int  # of those, packed truncated
    n_dropped: int  # of those, not packed (drop, or truncate that would leave a sequence no target)
    n_empty: int  # pairs with an empty sequence: not packed
    n_dropped_tokens: int  # sequence tokens not packed (dropped pairs, truncated tails, empty pairs' other side)
    n_prompt_tokens_saved: int  # prompt tokens held once instead of twice (shared-prompt layout)

    @property
    def lengths(self) -> np.ndarray:
        """Length of every item as packed (its segments with their padding)."""
        seg = self.real + self.pad
        if seg.size == 0:
            return np.zeros(self.pair.size, np.int64)
        return np.add.reduceat(seg, self.item_offsets[:-1]) if self.pair.size else np.zeros(0, np.int64)

    @property
    def segments_per_item(self) -> np.ndarray:
        return np.diff(self.item_offsets)


def _padded(n: np.ndarray, m: int) -> np.ndarray:
    return n + (-n) % m


def build_pair_items(
    pairs: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    scan: np.ndarray,
    size: int,
    overlong: Overlong | str,
    pad_multiple: int = 1,
    shared: bool = False,
    where: str = "token store",
) -> PairItems:
    """Pair items of the global pairs `pairs` (repeats allowed), given the GLOBAL document `starts`/`lengths`
    and the global `pair_scan` (`[3, n_global_pairs]`). Raises ConfigError for an over-long pair under
    `error` or `split`, naming it, its lengths and the fixes."""
    policy = Overlong(overlong)
    m = int(pad_multiple)
    if shared and m != 1:
        raise ConfigError(
            f"--pad-multiple {m} with --share-prompt, pack, the prompt's padding would sit between the prompt and "
            "its completions: leave --pad-multiple out or pack without --share-prompt"
        )
    pairs = np.asarray(pairs, np.int64)
    dc, dr = 2 * pairs, 2 * pairs + 1
    lc, lr = lengths[dc], lengths[dr]
    sc = scan[:, pairs]
    empty = (lc == 0) | (lr == 0)
    if shared:
        p = shared_prompt_lengths(sc, lc, lr)
        total = lc + lr - p
    else:
        p = np.zeros(pairs.size, np.int64)
        total = _padded(lc, m) + _padded(lr, m)
    long_mask = (total > size) & ~empty
    n_overlong = int(np.count_nonzero(long_mask))
    if n_overlong and policy in (Overlong.ERROR, Overlong.SPLIT):
        i = int(np.flatnonzero(long_mask)[0])
        why = (
            "a pair cannot be split across packs (both log-probs come from one pack), "
            if policy is Overlong.SPLIT
            else ""
        )
        parts = (
            f"prompt {int(p[i])} held once + chosen completion {int(lc[i] - p[i])} + rejected completion "
            f"{int(lr[i] - p[i])}"
            if shared
            else f"chosen {int(lc[i])} + rejected {int(lr[i])}"
        )
        raise ConfigError(
            f"pair {int(pairs[i])} needs {int(total[i])} tokens ({parts}), "
            f"longer than the pack size {size} ({n_overlong} over-long pairs in all), {where}, "
            f"{why}use --overlong drop|truncate or a larger --size"
        )
    keep_c, keep_r = lc.copy(), lr.copy()
    dropped = empty.copy()
    n_truncated = 0
    if n_overlong and policy is Overlong.DROP:
        dropped |= long_mask
    elif n_overlong and policy is Overlong.TRUNCATE:
        idx = np.flatnonzero(long_mask)
        a, b = lc[idx], lr[idx]
        if shared:
            pp = p[idx]
            budget = size - pp  # for both completions
            c, r = a - pp, b - pp
            k = np.maximum(budget // 2, budget - np.minimum(c, r))
            cut = pp + np.maximum(k, 0)
        else:
            cap = (size // m) * m
            half = (cap // (2 * m)) * m
            cut = np.maximum(half, cap - _padded(np.minimum(a, b), m))
        ta, tb = np.minimum(a, cut), np.minimum(b, cut)
        # a sequence that had target tokens must keep one (else its log-prob would be an empty sum)
        lost = ((ta <= sc[0, idx]) & (sc[0, idx] < a)) | ((tb <= sc[1, idx]) & (sc[1, idx] < b)) | (ta < 1) | (tb < 1)
        if shared:
            pt = shared_prompt_lengths(sc[:, idx], ta, tb)
            lost |= ta + tb - pt > size
            p[idx] = np.where(lost, p[idx], pt)
        keep_c[idx], keep_r[idx] = ta, tb
        dropped[idx[lost]] = True
        n_truncated = int(np.count_nonzero(~lost))
    kept = ~dropped
    n_dropped_tokens = int((lc + lr)[dropped].sum() + ((lc - keep_c) + (lr - keep_r))[kept].sum())
    pairs_k, dck, drk = pairs[kept], dc[kept], dr[kept]
    kc, kr, pk = keep_c[kept], keep_r[kept], p[kept]
    three = pk > 0
    nseg = np.where(three, 3, 2).astype(np.int64)
    item_offsets = np.zeros(pairs_k.size + 1, np.int64)
    np.cumsum(nseg, out=item_offsets[1:])
    n = int(item_offsets[-1])
    first = item_offsets[:-1]
    doc = np.empty(n, np.int64)
    src = np.empty(n, np.int64)
    real = np.empty(n, np.int64)
    role = np.empty(n, np.uint8)
    # two-segment items: [chosen][rejected]; three-segment: [prompt][chosen completion][rejected completion]
    t2, t3 = first[~three], first[three]
    doc[t2], src[t2], real[t2], role[t2] = dck[~three], starts[dck[~three]], kc[~three], ROLE_CHOSEN
    doc[t2 + 1], src[t2 + 1], real[t2 + 1], role[t2 + 1] = drk[~three], starts[drk[~three]], kr[~three], ROLE_REJECTED
    p3 = pk[three]
    doc[t3], src[t3], real[t3], role[t3] = dck[three], starts[dck[three]], p3, ROLE_PROMPT
    doc[t3 + 1], src[t3 + 1], real[t3 + 1] = dck[three], starts[dck[three]] + p3, kc[three] - p3
    role[t3 + 1] = ROLE_CHOSEN_COMPLETION
    doc[t3 + 2], src[t3 + 2], real[t3 + 2] = drk[three], starts[drk[three]] + p3, kr[three] - p3
    role[t3 + 2] = ROLE_REJECTED_COMPLETION
    pad = (-real) % m
    return PairItems(
        pair=pairs_k,
        item_offsets=item_offsets,
        doc=doc,
        src=src,
        real=real,
        pad=pad.astype(np.int64),
        role=role,
        n_pairs=int(pairs.size),
        n_overlong=n_overlong,
        n_truncated=n_truncated,
        n_dropped=int(np.count_nonzero(dropped & ~empty)),
        n_empty=int(np.count_nonzero(empty)),
        n_dropped_tokens=n_dropped_tokens,
        n_prompt_tokens_saved=int(p3.sum()),
    )


def pair_item_lengths(lc: np.ndarray, lr: np.ndarray, scan: np.ndarray, shared: bool) -> np.ndarray:
    """Item length of each pair (no padding, nothing dropped): chosen + rejected, or p + c + r when shared."""
    if not shared:
        return lc + lr
    return lc + lr - shared_prompt_lengths(scan, lc, lr)
