"""`packtool stats PACKS --world-size W --micro-batches B --model config.json`: how long data-parallel
ranks wait for each other, in the plain pack order and in the balanced one.

Each pack is priced by a `CostModel` (linear layers plus causal attention per segment, from a
transformers config.json or a hidden size) from the pack store's segment table alone. The plain
order is the one `PackedSampler(seed=...)` hands out in epoch 0, the balanced one what
`PackedSampler(balance=model, micro_batches=B)` hands out (the same `packtool.core.balance`
functions). Step efficiency = mean rank cost / max rank cost of a step; time saved = 1 - (sum of
the balanced steps' max) / (sum of the plain steps' max), the share of the epoch's step time that
balancing removes under the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packtool.core.balance import (
    DEFAULT_WINDOW,
    balanced_order,
    check_balance,
    epoch_order,
    step_costs,
    step_efficiency,
)
from packtool.core.cost import CostModel
from packtool.errors import ConfigError, UsageError


def cost_model(model: Path | None, hidden_size: int | None) -> tuple[CostModel, str]:
    """The cost model of `--model CONFIG.json` or `--hidden-size H`, and a name for it."""
    if model is not None and hidden_size is not None:
        raise UsageError("--model and --hidden-size both given, packtool stats, pass one of them")
    if model is not None:
        return CostModel.from_config(model), str(model)
    if hidden_size is None:
        raise UsageError("--world-size needs a cost model, packtool stats, pass --model CONFIG.json or --hidden-size H")
    return CostModel.from_shape(hidden_size), f"hidden size {hidden_size} (24·h² per token, 2·h·s² per segment)"


def step_balance(
    pack_offsets: np.ndarray,
    seg_lens: np.ndarray,
    *,
    world: int,
    micro_batches: int,
    model: CostModel,
    model_name: str,
    seed: int = 0,
    window: int = DEFAULT_WINDOW,
    prefix: np.ndarray | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """`(summary, per-step efficiencies)` of the plain and the balanced order of epoch 0 (`prefix`: per segment,
    the tokens of another segment it attends, `formats.pack_store.attended_prefix`)."""
    check_balance(world, micro_batches, window)
    costs = model.packs(pack_offsets, seg_lens, prefix)
    n = int(costs.size)
    if n == 0:
        raise ConfigError("the pack store has no packs, packtool stats --world-size, pack a non-empty split")
    if world > n:  # each rank needs a pack of the epoch; the plain order would allocate W entries
        raise UsageError(
            f"--world-size {world} is more ranks than the split has packs ({n}), packtool stats, "
            f"pass --world-size {n} or fewer (or pack the data into more packs)"
        )
    if world * micro_batches > n:  # a step larger than the epoch (10**30 overflowed numpy's reshape: a traceback)
        raise UsageError(
            f"--micro-batches {str(micro_batches)[:40]} x --world-size {world} is more packs per step than the split "
            f"has ({n}), packtool stats, pass --micro-batches {max(1, n // world)} or fewer"
        )
    plain = epoch_order(n, seed, 0, world=world)
    balanced = balanced_order(plain, costs, world=world, micro_batches=micro_batches, window=window, seed=seed)
    per_step: dict[str, np.ndarray] = {}
    summary: dict[str, Any] = {
        "world_size": world,
        "micro_batches": micro_batches,
        "window": window,
        "cost_model": {**model.to_dict(), "source": model_name},
    }
    times = {}
    for name, order in (("plain", plain), ("balanced", balanced)):
        ranks = step_costs(order, costs, world, micro_batches)
        eff = step_efficiency(ranks)
        worst = ranks.max(axis=1)
        per_step[name] = np.divide(ranks.mean(axis=1), worst, out=np.ones_like(worst), where=worst > 0)
        summary["steps"] = eff.steps
        summary[name] = {"mean": eff.mean, "p5": eff.p5, "min": eff.min}
        times[name] = eff.step_time
    summary["time_saved"] = 1.0 - times["balanced"] / times["plain"] if times["plain"] > 0 else 0.0
    summary["max_moved_steps"] = window - 1
    return summary, per_step
