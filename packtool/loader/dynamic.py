"""`DynamicBatchSampler`: batches of document indices under a token budget, sharded and resumable.

A fixed batch size of documents either wastes compute on padding (padded models) or makes the
token count per step swing with the length distribution (varlen models). A token budget fixes the
work per step instead::

    ds = DocumentDataset("out/tokens/text")
    sampler = DynamicBatchSampler(ds, max_tokens=16384, seed=0)            # varlen: sum of lengths
    loader = ResumableLoader(DataLoader(ds, batch_sampler=sampler, collate_fn=PackedCollator(flatten=True)))

    sampler = DynamicBatchSampler(ds, 16384, padded=True, round_to=64)      # [B, L]: B * L <= 16384
    loader = ResumableLoader(DataLoader(ds, batch_sampler=sampler, collate_fn=PaddedCollator(round_to=64)))

The plan of an epoch is a pure function of (lengths, budget, seed, epoch, world): `packtool.core.batching`
builds it (shared with `packtool stats`), every rank builds the same one and takes its own column.
Each rank gets the same number of batches (batches are split in two, never repeated, until their
count divides the world size, so every document is seen exactly once per epoch; `drop_last=True`
drops the remainder instead), and the batches of a step have similar cost: computed positions, or
with `balance=CostModel(...)` the model's cost, so the quadratic attention work of long documents is
balanced across ranks too, not only their token count. Resume is exact: the
state counts the batches the training loop consumed (through `ResumableLoader`, or `advance`).

Preference pairs: over a preference token store (`DocumentDataset.preference`, or `pairs=True` with
an array of lengths: documents 2i and 2i+1 are pair i) the plan is made of PAIRS, so the chosen and
the rejected sequence of a pair are always in the same batch, chosen first (what a padding-free or
padded DPO step needs: both log-probs of a pair in one forward). The budget keeps its meaning:
the sum of both sequences' (rounded) lengths, or with `padded=True` rows (two per pair) x the padded
row length; windows count documents as before (`window // 2` pairs).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from packtool.core.batching import (
    DEFAULT_WINDOW,
    SPLIT_GAIN,
    BatchPlan,
    assign_ranks,
    check_budget,
    pair_documents,
    pair_units,
    plan_batches,
    priced,
    split_to_multiple,
)
from packtool.core.cost import CostModel
from packtool.errors import ConfigError

STATE_VERSION = 1
_CHECKED = (
    "n",
    "max_tokens",
    "padded",
    "round_to",
    "window",
    "split_gain",
    "shuffle",
    "seed",
    "drop_last",
    "num_replicas",
    "pairs",
)


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def lengths_of(data: Any) -> np.ndarray:
    """Document lengths of a dataset (`.lengths`, e.g. `DocumentDataset`) or an array of lengths."""
    lengths = getattr(data, "lengths", data)
    try:
        arr = np.asarray(lengths, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"cannot read document lengths from {type(data).__name__}, DynamicBatchSampler, pass a DocumentDataset or a 1-D array of lengths"
        ) from exc
    if arr.ndim != 1:
        raise ConfigError(
            f"document lengths must be 1-D, got shape {arr.shape}, DynamicBatchSampler, pass a DocumentDataset or a 1-D array of lengths"
        )
    return arr


class DynamicBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yields this rank's batches (lists of document indices) of one epoch; see the module docstring.

    max_tokens: the budget: sum of lengths (`padded=False`) or `len(batch) * round_up(longest,
        round_to)` (`padded=True`); a longer document forms a batch alone.
    round_to: lengths count rounded up to this multiple (the padded row length `PaddedCollator(round_to=)`
        produces; with `padded=False`, the per-document rounding a collator would add).
    window: documents per length-sorted window in padded mode (sorting only inside windows of the
        shuffled order keeps the randomness of the order).
    split_gain: padded mode: cut a batch in two where that saves at least this share of its computed
        positions (`packtool.core.batching`); 1.0 keeps NeMo-RL's plain greedy batches.
    shuffle, seed: the epoch's order is `default_rng([seed, epoch]).permutation(n)`; without shuffle
        the index order (still sorted inside windows when padded).
    num_replicas, rank: data-parallel world; default from `torch.distributed` when initialised.
    drop_last: drop the batches that do not fill a last step of `num_replicas` batches, instead of
        splitting batches so that every document is seen.
    balance: a `CostModel`: deal each step's batches to ranks by the model's cost (linear plus
        causal attention, `packtool.core.cost`) instead of by computed positions. The budget stays
        `max_tokens`.
    pairs: plan whole preference pairs (documents 2i, 2i+1) so that no pair is split across batches;
        default: True exactly when `dataset` is a preference `DocumentDataset`. `pairs=False` on one
        batches its sequences independently (a pair may then be split: its pair log-probs cannot be
        computed in one step).
    """

    def __init__(
        self,
        dataset: Any,
        max_tokens: int,
        *,
        padded: bool = False,
        round_to: int = 1,
        window: int = DEFAULT_WINDOW,
        split_gain: float = SPLIT_GAIN,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
        balance: CostModel | tuple[float, float] | None = None,
        pairs: bool | None = None,
    ) -> None:
        check_budget(int(max_tokens), int(round_to), int(window), float(split_gain))
        world, me = _world()
        self.lengths = lengths_of(dataset)
        self.n = int(self.lengths.size)
        if self.n == 0:
            raise ConfigError("the dataset has no documents, DynamicBatchSampler, tokenize a non-empty corpus")
        if self.lengths.min() < 0:
            raise ConfigError("document lengths must be >= 0, DynamicBatchSampler, pass token counts")
        self.pairs = getattr(dataset, "preference", None) is not None if pairs is None else bool(pairs)
        if self.pairs and self.n % 2:
            raise ConfigError(
                f"pairs=True needs an even number of documents (2i chosen, 2i+1 rejected), got {self.n}, "
                "DynamicBatchSampler, pass the lengths of a preference token store or pairs=False"
            )
        self.num_replicas = world if num_replicas is None else int(num_replicas)
        self.rank = me if rank is None else int(rank)
        if self.num_replicas < 1 or not 0 <= self.rank < self.num_replicas:
            raise ConfigError(
                f"rank {self.rank} is not in 0..{self.num_replicas - 1}, DynamicBatchSampler, pass 0 <= rank < num_replicas"
            )
        self.max_tokens, self.padded, self.round_to = int(max_tokens), bool(padded), int(round_to)
        self.window, self.split_gain = int(window), float(split_gain)
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.balance = None if balance is None else CostModel.coerce(balance, "DynamicBatchSampler")
        self.epoch = 0
        self.consumed = 0  # batches of this epoch the training loop consumed (this rank)
        self._cache: tuple[int, np.ndarray, BatchPlan] | None = None
        self._steps(0)  # plan now: a budget/world that cannot work fails before training starts

    # -- the plan ------------------------------------------------------------------------
    def _steps(self, epoch: int) -> tuple[np.ndarray, BatchPlan]:
        """`([n_steps, world] batch ids, plan)` of `epoch`, cached for the last epoch asked."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1], self._cache[2]
        rng = np.random.default_rng([self.seed, epoch])
        units, max_tokens, round_to, window = self.lengths, self.max_tokens, self.round_to, self.window
        if self.pairs:
            units, max_tokens, round_to, window = pair_units(
                self.lengths, self.max_tokens, self.padded, self.round_to, self.window
            )
        order = rng.permutation(units.size) if self.shuffle else None
        plan = plan_batches(
            units,
            max_tokens,
            padded=self.padded,
            round_to=round_to,
            window=window,
            order=order,
            split_gain=self.split_gain,
        )
        world = self.num_replicas
        if self.drop_last:
            keep = plan.n_batches - plan.n_batches % world
            if keep == 0:
                raise ConfigError(
                    f"{plan.n_batches} batches cannot feed {world} ranks with drop_last=True, DynamicBatchSampler, use drop_last=False or a smaller max_tokens"
                )
            plan = BatchPlan(plan.offsets[: keep + 1], plan.docs, plan.cost[:keep], plan.tokens[:keep])
        else:
            plan = split_to_multiple(plan, units, world, self.padded, round_to)
        if self.pairs:
            plan = pair_documents(plan, self.lengths, self.padded, self.round_to)
        cost = (
            plan.cost if self.balance is None else priced(plan, self.lengths, self.balance, self.padded, self.round_to)
        )
        steps = assign_ranks(cost, world, rng if self.shuffle else None)
        self._cache = (epoch, steps, plan)
        return steps, plan

    def batches(self, epoch: int | None = None, rank: int | None = None) -> list[list[int]]:
        """Every batch of `rank` (default: this one) in `epoch` (default: the current one), in order."""
        steps, plan = self._steps(self.epoch if epoch is None else int(epoch))
        r = self.rank if rank is None else int(rank)
        docs, offsets = plan.docs, plan.offsets
        return [docs[offsets[b] : offsets[b + 1]].tolist() for b in steps[:, r].tolist()]

    def costs(self, epoch: int | None = None) -> np.ndarray:
        """`[n_steps, world]` cost of each rank's batch at each step (for balance checks): computed
        positions, or the cost model's price with `balance`."""
        steps, plan = self._steps(self.epoch if epoch is None else int(epoch))
        if self.balance is None:
            return plan.cost[steps]
        return priced(plan, self.lengths, self.balance, self.padded, self.round_to)[steps]

    # -- the Sampler protocol ------------------------------------------------------------
    def __iter__(self) -> Iterator[list[int]]:
        start = self.consumed  # read NOW: DataLoader creates this iterator before any advance
        steps, plan = self._steps(self.epoch)
        docs, offsets = plan.docs, plan.offsets
        for b in steps[start:, self.rank].tolist():
            yield docs[offsets[b] : offsets[b + 1]].tolist()

    def __len__(self) -> int:
        return int(self._steps(self.epoch)[0].shape[0]) - self.consumed

    def set_epoch(self, epoch: int) -> None:
        """Select the order of `epoch`; a NEW epoch starts at its first batch (the current one keeps
        the resume point, so `set_epoch(epoch)` at the top of a resumed epoch is harmless)."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.consumed = 0

    def advance(self, n: int = 1) -> None:
        """Record that the training loop consumed `n` more batches of this epoch."""
        total = int(self._steps(self.epoch)[0].shape[0])
        self.consumed = min(total, self.consumed + int(n))

    @property
    def exhausted(self) -> bool:
        return self.consumed >= int(self._steps(self.epoch)[0].shape[0])

    def state_dict(self) -> dict[str, Any]:
        state = {key: getattr(self, key) for key in _CHECKED}
        state["balance"] = None if self.balance is None else self.balance.to_dict()
        return {
            "version": STATE_VERSION,
            "kind": "dynamic",
            **state,
            "rank": self.rank,
            "epoch": self.epoch,
            "consumed": self.consumed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state`; refuses a state of another dataset size, budget, seed or world size."""
        if state.get("version") != STATE_VERSION or state.get("kind") != "dynamic":
            raise ConfigError(
                f"sampler state {state.get('kind')!r} version {state.get('version')!r} is not a DynamicBatchSampler state v{STATE_VERSION}, DynamicBatchSampler.load_state_dict, use a checkpoint of this sampler"
            )
        mine = self.state_dict()
        for key in (*_CHECKED, "balance"):  # a state from before cost balancing has no `balance` (None)
            theirs = state.get(key, False) if key == "pairs" else state.get(key)  # states before pairs: False
            if theirs != mine[key]:
                raise ConfigError(
                    f"sampler state has {key}={theirs!r} but this sampler has {mine[key]!r}, DynamicBatchSampler.load_state_dict, resume with the same dataset, budget, seed, world size and balancing"
                )
        self.epoch = int(state["epoch"])
        self.consumed = int(state["consumed"])
