"""Balanced data-parallel steps: deal each step's packs so that no rank waits for another (numpy, no torch).

The plain order of an epoch (`epoch_order`, what `PackedSampler` has always used) is a seeded
permutation of the packs, padded by wrap-around (or cut) to a multiple of the world size W. Rank r
takes every W-th index from r, so global step t of B micro-batches per rank holds the positions
`[t·B·W, (t+1)·B·W)` of that order. Packs of equal length still differ in cost (`core.cost`): a
step lasts as long as its most expensive rank.

`balanced_order` rearranges the plain order inside windows of K consecutive steps only, so the set
of packs of steps `[jK, (j+1)K)` (over all ranks) is exactly the plain one and no pack moves more
than K - 1 steps. Inside a window of M = K·W·B packs:

1. the K·W rank slots ("bins", one rank's B micro-batches of one step) are filled largest pack
   first, each round of K·W packs going to the bins with the least cost so far (longest processing
   time first with B packs per bin);
2. the bins are ordered by cost and cut into K steps of W, so bins of similar cost share a step;
3. the ranks of each step, and the steps of the window, are put in a seeded random order, so step
   index and step cost stay uncorrelated over the epoch (no global sort by cost).

Every rank computes the same plan from (costs, seed, epoch) alone, with no communication. A final
step that holds fewer than B packs per rank (the epoch does not fill it) takes the cheapest packs of
its window (similar costs) and is balanced on its own.
Vectorised over all windows at once: a few argsorts of `[windows, K·W]` arrays per epoch,
microseconds per step (scripts/bench_balance.py, docs/BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packtool.errors import ConfigError

DEFAULT_WINDOW = 128
"""Steps per balancing window (chosen by scripts/bench_balance.py: see docs/BENCHMARKS.md)."""

_SALT = 0xBA1A
"""Mixed into the seed of the window shuffles so they never reuse the epoch permutation's stream."""


def check_balance(world: int, micro_batches: int, window: int) -> None:
    """Refuse shapes that cannot describe a step, with the fix."""
    for name, value in (("num_replicas", world), ("micro_batches", micro_batches), ("window", window)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}, balanced sampling, pass e.g. {name}=1")


def epoch_order(
    n: int, seed: int, epoch: int, *, shuffle: bool = True, world: int = 1, drop_last: bool = False
) -> np.ndarray:
    """The plain global order of `epoch`: `default_rng([seed, epoch]).permutation(n)` (or `arange`),
    padded by wrapping around (or cut, with `drop_last`) to a multiple of `world`; rank r's share is
    `order[r::world]` (`DistributedSampler`'s rule)."""
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    samples = n // world if drop_last else -(-n // world)
    total = samples * world
    if total > n:
        order = np.concatenate([order, np.resize(order, total - n)])
    return order[:total]


def _plan_windows(cost: np.ndarray, steps: int, world: int, slots: int, rng: np.random.Generator) -> np.ndarray:
    """For `cost` `[n_windows, steps·world·slots]` (in plain order), the permutation `[n_windows, M]`
    of each window's positions in balanced order (layout per window: step, micro-batch, rank)."""
    nw, m = cost.shape
    nbins = steps * world
    rows = np.arange(nw)[:, None]
    desc = np.argsort(-cost, axis=1, kind="stable")
    members = np.empty((nw, nbins, slots), np.int64)
    loads = np.zeros((nw, nbins), np.float64)
    for j in range(slots):  # LPT by rounds: the next K·W largest packs go to the lightest bins
        chunk = desc[:, j * nbins : (j + 1) * nbins]
        target = np.broadcast_to(np.arange(nbins), (nw, nbins)) if j == 0 else np.argsort(loads, axis=1, kind="stable")
        members[rows, target, j] = chunk
        loads[rows, target] += np.take_along_axis(cost, chunk, axis=1)
    by_load = np.argsort(-loads, axis=1, kind="stable")  # similar bins side by side, cut into steps
    grid = members[rows, by_load].reshape(nw, steps, world, slots)
    ranks = np.argsort(rng.random((nw, steps, world)), axis=2)
    grid = np.take_along_axis(grid, ranks[..., None], axis=2)
    order = np.argsort(rng.random((nw, steps)), axis=1)
    grid = grid[rows, order]
    return grid.transpose(0, 1, 3, 2).reshape(nw, m)


def balanced_order(
    order: np.ndarray,
    cost: np.ndarray,
    *,
    world: int,
    micro_batches: int = 1,
    window: int = DEFAULT_WINDOW,
    seed: int = 0,
    epoch: int = 0,
) -> np.ndarray:
    """`order` (a plain `epoch_order`, length a multiple of `world`) rearranged inside windows of
    `window` steps so each step's rank costs are as equal as the window allows (module docstring).

    `cost[p]` is the cost of pack p. Rank r's share of the result is `result[r::world]`, its step t
    the indices `[t·B, (t+1)·B)` of that share.
    """
    check_balance(world, micro_batches, window)
    order = np.asarray(order, np.int64)
    if order.size % world:
        raise ConfigError(
            f"the order holds {order.size} packs, not a multiple of {world} ranks, balanced_order, pass epoch_order(...)"
        )
    if world == 1:  # one rank never waits for another: keep the plain order
        return order.copy()
    c = np.asarray(cost, np.float64)[order]
    rng = np.random.default_rng([seed, epoch, _SALT])
    per_step = world * micro_batches
    n_steps = order.size // per_step
    body = n_steps // window * window * per_step
    out = np.empty_like(order)
    if body:  # every full window at once
        perm = _plan_windows(c[:body].reshape(-1, window * per_step), window, world, micro_batches, rng)
        out[:body] = np.take_along_axis(order[:body].reshape(perm.shape), perm, axis=1).reshape(-1)
    last, c_last = order[body:], c[body:]  # the last window: its full steps, then maybe a short final step
    short = (order.size - n_steps * per_step) // world  # micro-batches per rank of that final step
    by_cost = np.argsort(c_last, kind="stable")
    parts = (  # the short step takes the window's cheapest packs: similar costs, so it balances too
        (np.sort(by_cost[world * short :]), n_steps % window, micro_batches),
        (np.sort(by_cost[: world * short]), 1, short),
    )
    at = body
    for pick, steps, slots in parts:
        if pick.size == 0:
            continue
        perm = _plan_windows(c_last[pick][None, :], steps, world, slots, rng)[0]
        out[at : at + pick.size] = last[pick][perm]
        at += pick.size
    return out


def step_costs(order: np.ndarray, cost: np.ndarray, world: int, micro_batches: int = 1) -> np.ndarray:
    """`[n_steps, world]` cost of each rank at each step of a global `order` (a short final step
    sums the micro-batches it has)."""
    c = np.asarray(cost, np.float64)[np.asarray(order, np.int64)]
    per_step = world * micro_batches
    full = c.size // per_step
    out = c[: full * per_step].reshape(full, micro_batches, world).sum(axis=1)
    if c.size > full * per_step:
        out = np.vstack([out, c[full * per_step :].reshape(-1, world).sum(axis=0, keepdims=True)])
    return out


@dataclass(frozen=True)
class StepEfficiency:
    """How well the ranks of each step are balanced: efficiency = mean rank cost / max rank cost."""

    steps: int
    mean: float
    p5: float
    min: float
    step_time: float
    """Sum over steps of the slowest rank's cost (what the epoch takes, in the cost model's units)."""

    def to_dict(self) -> dict[str, float | int]:
        return {"steps": self.steps, "mean": self.mean, "p5": self.p5, "min": self.min, "step_time": self.step_time}


def step_efficiency(per_rank: np.ndarray) -> StepEfficiency:
    """Summary of `[n_steps, world]` rank costs (`step_costs`)."""
    per_rank = np.asarray(per_rank, np.float64)
    worst = per_rank.max(axis=1)
    eff = np.divide(per_rank.mean(axis=1), worst, out=np.ones_like(worst), where=worst > 0)
    if eff.size == 0:
        return StepEfficiency(0, 1.0, 1.0, 1.0, 0.0)
    return StepEfficiency(
        steps=int(eff.size),
        mean=float(eff.mean()),
        p5=float(np.percentile(eff, 5)),
        min=float(eff.min()),
        step_time=float(worst.sum()),
    )


def max_displacement(plain: np.ndarray, balanced: np.ndarray, world: int, micro_batches: int = 1) -> int:
    """The most steps any position's pack moved between two orders of the same positions (test and
    benchmark helper: packs may repeat in a padded order, so positions are matched per pack value in
    order of appearance)."""
    per_step = world * micro_batches
    a = np.argsort(np.asarray(plain), kind="stable")
    b = np.argsort(np.asarray(balanced), kind="stable")
    return int(np.abs(a // per_step - b // per_step).max(initial=0)) if a.size else 0
