"""A `PackedSampler`'s state: written (`state_of`), checked against the sampler that loads it, and moved to
another world size (`load_state`): at the same size exactly where it was, at another from the same global
sample; a balanced state mid-window re-deals the interrupted window's packs not consumed yet as the new
layout's head (`packtool.loader.sampler_windows`).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from packtool.errors import ConfigError
from packtool.loader.sampler_windows import WindowedLayout

STATE_VERSION = 1
HEAD_STATE_VERSION = 2
"""A state whose layout starts with the rest of an interrupted window (`head`: a balanced elastic resume mid-window)
is written as version 2, so a packtool that cannot rebuild that window refuses it rather than skipping packs."""
_MAX_KEY = 2**63 - 1  # a blend's keys are int64
_MAX_WORLD = 1 << 24  # ranks of a state's interrupted layouts: rebuilding one allocates O(ranks) positions


def state_of(s: WindowedLayout) -> dict[str, Any]:
    """The state of sampler `s` (what `PackedSampler.state_dict()` returns)."""
    state = {
        "version": STATE_VERSION if s.head is None else HEAD_STATE_VERSION,
        "epoch": s.epoch,
        "consumed": s.consumed,
        "base": s.base,
        "global_sample": s.global_sample,
        "seed": s.seed,
        "n": s.n,
        "num_replicas": s.num_replicas,
        "rank": s.rank,
        "shuffle": s.shuffle,
        "drop_last": s.drop_last,
        "order": s.order_kind,
        "blend": None if s.blend is None else s.blend.fingerprint,
        "balance": None if s.balance is None else s.balance.to_dict(),
        "micro_batches": s.micro_batches,
        "window": s.window,
    }
    if s.head is not None:  # O(resumes in a row mid-head-window): a few ints each, never positions
        state["head"] = copy.deepcopy(s.head)
    return state


def load_state(s: WindowedLayout, state: dict[str, Any]) -> None:
    """Move sampler `s` to `state` (what `PackedSampler.load_state_dict` does)."""
    if not isinstance(state, Mapping):  # None raised AttributeError
        raise ConfigError(
            f"sampler state is a {type(state).__name__}, not a mapping, PackedSampler.load_state_dict, "
            "pass the dict state_dict() returned"
        )
    if state.get("version") not in (STATE_VERSION, HEAD_STATE_VERSION):
        raise ConfigError(
            f"sampler state version {state.get('version')!r} is not {STATE_VERSION} or {HEAD_STATE_VERSION}, PackedSampler.load_state_dict, use a checkpoint from this packtool"
        )
    mine = state_of(s)
    theirs_blend = state.get("blend")
    if theirs_blend != mine["blend"]:
        what = f"blend {theirs_blend}" if theirs_blend else "a plain dataset"
        here = f"blend {mine['blend']}" if mine["blend"] else "a plain dataset"
        raise ConfigError(
            f"sampler state is of {what} but this sampler reads {here}, PackedSampler.load_state_dict, resume with the same stores, weights, seed, split and size"
        )
    keys = ["n", "seed", "shuffle", "drop_last", "order", "balance"]
    if s.balance is not None:  # the plan depends on these only when balancing
        keys += ["micro_batches", "window"]
    defaults = {"order": "numpy"}  # a state from before lazy orders
    for key in keys:
        theirs = state.get(key, defaults.get(key))  # a state from before balancing has no `balance` (None: plain)
        if theirs != mine[key]:
            raise ConfigError(
                f"sampler state has {key}={theirs!r} but this sampler has {mine[key]!r}, PackedSampler.load_state_dict, resume with the same dataset, seed and balancing"
            )
    fields = {k: state.get(k, 0 if k == "base" else None) for k in ("num_replicas", "consumed", "base", "epoch")}
    for key, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (key == "num_replicas"):
            raise ConfigError(
                f"sampler state has {key}={value!r}, not an integer >= {int(key == 'num_replicas')}, "
                "PackedSampler.load_state_dict, pass a state_dict() this packtool wrote"
            )
    world, consumed, base = int(state["num_replicas"]), int(state["consumed"]), int(state.get("base", 0))
    epoch, head = int(state["epoch"]), state.get("head")
    check_epoch(s, epoch, "PackedSampler.load_state_dict")
    _check_head(head, s.balance is not None)
    taken = state.get("global_sample", base + consumed * world)  # all layouts before, with this one
    if isinstance(taken, bool) or not isinstance(taken, (int, np.integer)) or taken < 0:
        raise ConfigError(
            f"sampler state has global_sample={taken!r}, not an integer >= 0, PackedSampler.load_state_dict, "
            "pass a state_dict() this packtool wrote"
        )
    # a base past n: an epoch that ended in padding, moved to another world size by an earlier packtool (which
    # kept such a base; this one clamps it to n), or else an epoch silently empty
    over = head is None and consumed == 0 and base <= 2 * s.n and taken == base
    if base > s.n and not over:
        raise ConfigError(
            f"sampler state has base={base}, past the {s.n} samples of an epoch, PackedSampler.load_state_dict, "
            "pass a state_dict() this packtool wrote for this dataset"
        )
    # samples consumed before this layout began, when not `base`: its head's, or padding past the epoch's end
    pre: int | None = int(taken) - consumed * world
    if pre is not None and (pre < 0 or (head is None and pre == base)):
        pre = None
    known = None
    if head is not None:  # the interrupted window, recomputed here, must be the one the state was taken in
        known = s._layout(head)._cut(epoch)[:2]
        if digest(*known) != head.get("digest"):
            raise ConfigError(
                "sampler state's interrupted window holds other packs or costs here, PackedSampler.load_state_dict, "
                "resume with the same dataset, cost model and packtool version"
            )
    count = s._layout({"num_replicas": world, "base": base, "consumed": 0, "head": None})._count(
        0 if known is None else known[0].size
    )
    if consumed > count:  # len() raised ValueError, or a far elastic base emptied the epoch
        raise ConfigError(
            f"sampler state has consumed={consumed}, past the {count} indices each of its {world} ranks has in epoch "
            f"{epoch}, PackedSampler.load_state_dict, pass a state_dict() this packtool wrote for this dataset"
        )
    if world == s.num_replicas or consumed == 0:  # where it was (consumed 0: its head re-dealt at this size)
        pass
    elif s.balance is None:  # elastic: the same global sample, dealt to the new ranks
        pre = None if pre is None else pre + consumed * world
        base, consumed = base + consumed * world, 0
    else:  # elastic mid-window: the interrupted window's packs not consumed yet become this layout's head
        prev = s._layout({"num_replicas": world, "base": base, "consumed": consumed, "head": head})
        prev.epoch = epoch
        prev._head_cache = None if known is None else (epoch, *known)  # rebuilt once, above
        rest, rest_costs, end = prev._cut(epoch)
        _, h0, rb, _ = prev._span(epoch)
        hp = h0 // world
        if rest.size == 0:  # a window boundary: exactly the plain elastic resume
            head = None
        elif consumed < hp:  # inside the head window: that window depends on the head before it
            head = {"num_replicas": world, "base": base, "consumed": consumed, "head": head}
        else:  # inside a regular window: it depends on where the regular windows start, nothing before
            head = {"num_replicas": world, "base": rb, "consumed": consumed - hp, "head": None}
        if head is not None:
            head["digest"] = digest(rest, rest_costs)
        # every layout before, with this one (was: none but `end` at a window boundary after a head: 60, not 58)
        pre = (base if pre is None else pre) + consumed * world
        known = None if head is None else (rest, rest_costs)
        base, consumed = end, 0
    if base > s.n:  # past the epoch's samples: only padding was left (a base past n is refused at load)
        pre, base = (base if pre is None else pre), s.n  # global_sample still counts the padding consumed
    if head is None and pre == base:
        pre = None
    s.epoch, s.base, s.consumed, s.head, s.pre = epoch, base, consumed, head, pre
    s._cache = None
    s._head_cache = None if known is None else (epoch, *known)


def check_epoch(s: WindowedLayout, epoch: Any, where: str) -> None:
    """Refuse an epoch that is no integer >= 0 (`set_epoch(-1)` yielded negative keys, `set_epoch(1.5)` epoch 1),
    or one whose blend keys `epoch * len(blend) + t` would pass 2**63 - 1."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise ConfigError(f"epoch {epoch!r} is not an integer >= 0, {where}, pass the epoch number (0, 1, 2, ...)")
    if s.blend is not None and (int(epoch) + 1) * s.n > _MAX_KEY + 1:
        raise ConfigError(
            f"epoch {epoch} of a blend of {s.n} samples has keys past 2**63 - 1, {where}, "
            f"pass an epoch below {(_MAX_KEY + 1) // s.n}"
        )


def digest(positions: np.ndarray, costs: np.ndarray) -> str:
    """A fingerprint of head positions and their pack costs: a state's head is rebuilt from a few ints, and
    this proves the rebuild found the same packs (same dataset, cost model and plan; a blend's identity is
    its fingerprint, checked before)."""
    h = hashlib.blake2b(np.ascontiguousarray(positions, np.int64).tobytes(), digest_size=8)
    h.update(np.ascontiguousarray(costs, np.float64).tobytes())
    return h.hexdigest()


def _check_head(head: Any, balanced: bool) -> None:
    """Refuse a `head` (an interrupted layout: world size, base, consumed, its own head) that is not one."""
    while head is not None:
        ok = balanced and isinstance(head, dict) and set(head) <= {"num_replicas", "base", "consumed", "head", "digest"}
        ok = ok and all(
            isinstance(head.get(k), int) and not isinstance(head.get(k), bool) and head[k] >= (k == "num_replicas")
            for k in ("num_replicas", "base", "consumed")
        )
        ok = ok and head["num_replicas"] <= _MAX_WORLD
        if not ok:
            raise ConfigError(
                f"sampler state has a malformed head {head!r}, PackedSampler.load_state_dict, resume from the state the sampler wrote"
            )
        head = head.get("head")
