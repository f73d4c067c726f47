"""A `PackedSampler`'s state: written (`state_of`), checked against the sampler that loads it, and moved to
another world size (`load_state`): at the same size exactly where it was, at another from the same global
sample; a balanced state mid-window re-deals the interrupted window's packs not consumed yet as the new
layout's head (`packtool.loader.sampler_windows`).
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import numpy as np

from packtool.errors import ConfigError
from packtool.loader.sampler_windows import WindowedLayout

STATE_VERSION = 1
HEAD_STATE_VERSION = 2
"""A state whose layout starts with the rest of an interrupted window (`head`: a balanced elastic resume mid-window)
is written as version 2, so a packtool that cannot rebuild that window refuses it rather than skipping packs."""


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
    _check_head(head, s.balance is not None)
    pre = None if head is None else int(state["global_sample"]) - consumed * world
    known = None
    if head is not None:  # the interrupted window, recomputed here, must be the one the state was taken in
        known = s._layout(head)._cut(epoch)[:2]
        if digest(*known) != head.get("digest"):
            raise ConfigError(
                "sampler state's interrupted window holds other packs or costs here, PackedSampler.load_state_dict, "
                "resume with the same dataset, cost model and packtool version"
            )
    if world == s.num_replicas or consumed == 0:  # where it was (consumed 0: its head re-dealt at this size)
        pass
    elif s.balance is None:  # elastic: the same global sample, dealt to the new ranks
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
        taken = int(state.get("global_sample", base + consumed * world))  # all layouts before, with this one
        pre, known = (None, None) if head is None else (taken, (rest, rest_costs))
        base, consumed = end, 0
    s.epoch, s.base, s.consumed, s.head, s.pre = epoch, base, consumed, head, pre
    s._cache = None
    s._head_cache = None if known is None else (epoch, *known)


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
        if not ok:
            raise ConfigError(
                f"sampler state has a malformed head {head!r}, PackedSampler.load_state_dict, resume from the state the sampler wrote"
            )
        head = head.get("head")
