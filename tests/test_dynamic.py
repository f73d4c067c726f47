"""DynamicBatchSampler and the torch-free planner behind it (`packtool.core.batching`): every document once
per epoch, the budget, over-long documents alone, determinism, set_epoch, exact resume, DP balance,
and padded waste against random and sorted batches on Zipf-like lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.core.batching import dynamic_waste, plan_batches
from packtool.errors import ConfigError
from packtool.loader import DocumentDataset, DynamicBatchSampler, PackedCollator, PaddedCollator, ResumableLoader


def zipf_lengths(n: int, seed: int = 0, cap: int = 6000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.4, size=n) * 7, cap)
    lengths[::97] = 0  # empty documents
    return lengths


def cost(lengths: np.ndarray, batch: list[int], padded: bool, round_to: int) -> int:
    rounded = -(-lengths[batch] // round_to) * round_to
    return int(len(batch) * rounded.max()) if padded else int(rounded.sum())


def check_epoch(s: DynamicBatchSampler, lengths: np.ndarray, epoch: int) -> list[list[list[int]]]:
    """The shared invariant checker: every document once over all ranks, equal batch counts, budget."""
    per_rank = [s.batches(epoch, r) for r in range(s.num_replicas)]
    assert len({len(b) for b in per_rank}) == 1, "ranks must get the same number of batches"
    seen = np.concatenate([np.array(b, np.int64) for rank in per_rank for b in rank])
    np.testing.assert_array_equal(np.sort(seen), np.arange(lengths.size))
    for rank in per_rank:
        for b in rank:
            assert b, "no empty batch"
            c = cost(lengths, b, s.padded, s.round_to)
            assert c <= s.max_tokens or len(b) == 1, (c, b)
    return per_rank


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("world", [1, 3, 8])
def test_every_document_once_under_the_budget(padded, world):
    lengths = zipf_lengths(5000, seed=1)
    over = np.flatnonzero(lengths > 4096)
    assert over.size > 0
    for rank in range(world):
        s = DynamicBatchSampler(lengths, 4096, padded=padded, round_to=8, num_replicas=world, rank=rank, seed=3)
        assert list(s) == s.batches()
        assert len(s) == len(s.batches())
    per_rank = check_epoch(s, lengths, 0)
    check_epoch(s, lengths, 1)
    alone = {b[0] for rank in per_rank for b in rank if len(b) == 1}
    assert set(over.tolist()) <= alone, "a document over the budget is a batch alone"


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=200),
    max_tokens=st.integers(1, 1000),
    padded=st.booleans(),
    round_to=st.sampled_from([1, 3, 8]),
    window=st.integers(1, 64),
    world=st.integers(1, 4),
    split_gain=st.sampled_from([0.1, 0.25, 1.0]),
)
def test_planner_invariants_on_any_lengths(lengths, max_tokens, padded, round_to, window, world, split_gain):
    arr = np.array(lengths, np.int64)
    try:
        s = DynamicBatchSampler(arr, max_tokens, padded=padded, round_to=round_to, window=window, num_replicas=world,
                                rank=0, seed=0, split_gain=split_gain)
    except ConfigError as exc:  # only when even one document per batch cannot fill whole steps
        n_batches = plan_batches(arr, max_tokens, padded=padded, round_to=round_to, window=window, split_gain=split_gain,
                                 order=np.random.default_rng([0, 0]).permutation(arr.size)).n_batches
        assert "ranks" in str(exc) and arr.size < -(-n_batches // world) * world
        return
    check_epoch(s, arr, 0)


def test_splitting_wasteful_batches_only_removes_padding(document_stores):
    """split_gain=1 is NeMo-RL's plain greedy; the default cuts a batch where that saves >= 25% of it."""
    for lengths, budget in ((DocumentDataset(document_stores["text"]).lengths, 4096), (zipf_lengths(20000, 5), 131072)):
        order = np.random.default_rng(0).permutation(lengths.size)
        greedy = plan_batches(lengths, budget, padded=True, order=order, split_gain=1.0)
        split = plan_batches(lengths, budget, padded=True, order=order)
        np.testing.assert_array_equal(greedy.docs, split.docs)  # same order, finer cuts only
        assert set(greedy.offsets.tolist()) <= set(split.offsets.tolist())
        assert split.n_batches > greedy.n_batches and split.cost.sum() < greedy.cost.sum()
        for b in range(split.n_batches):  # no cut could have saved 25% of its batch
            lens = lengths[split.batch(b)]
            whole = lens.size * lens.max()
            cuts = [m * lens[:m].max() + (lens.size - m) * lens[m:].max() for m in range(1, lens.size)]
            assert not cuts or min(cuts) > 0.75 * whole


def test_deterministic_per_seed_and_epoch():
    lengths = zipf_lengths(3000, seed=2)
    a, b = (DynamicBatchSampler(lengths, 8192, padded=True, seed=5) for _ in range(2))
    assert a.batches(0) == b.batches(0) and a.batches(4) == b.batches(4)
    assert a.batches(0) != a.batches(1), "set_epoch must change the order"
    assert a.batches(0) != DynamicBatchSampler(lengths, 8192, padded=True, seed=6).batches(0)
    a.set_epoch(1)
    assert list(a) == b.batches(1)
    unshuffled = DynamicBatchSampler(lengths, 8192, shuffle=False)
    assert unshuffled.batches(0) == unshuffled.batches(1)


def test_padded_batches_stay_inside_their_window():
    lengths = zipf_lengths(4096, seed=3)
    s = DynamicBatchSampler(lengths, 8192, padded=True, window=512, seed=1)
    order = np.random.default_rng([1, 0]).permutation(lengths.size)
    where = np.empty(lengths.size, np.int64)
    where[order] = np.arange(lengths.size)
    for batch in s.batches():
        windows = np.unique(where[batch] // 512)
        assert windows.size <= 2 and (windows.size == 1 or windows[1] == windows[0] + 1)


@pytest.mark.parametrize("padded", [False, True])
def test_ranks_are_balanced_by_tokens(padded):
    lengths = zipf_lengths(20000, seed=4)
    s = DynamicBatchSampler(lengths, 16384, padded=padded, num_replicas=4, rank=0, seed=0)
    costs = s.costs()  # [steps, ranks]
    totals = costs.sum(axis=0)
    assert totals.max() / totals.min() < 1.01, totals
    # each step's batches have similar cost, so no rank waits long (random grouping would not be)
    spread = (costs.max(axis=1) - costs.min(axis=1)).sum() / costs.sum()
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(costs.reshape(-1)).reshape(costs.shape)
    random_spread = (shuffled.max(axis=1) - shuffled.min(axis=1)).sum() / shuffled.sum()
    assert spread < random_spread / 3, (spread, random_spread)


def random_batch_waste(lengths: np.ndarray, batch: int, seed: int = 0, sort: bool = False) -> float:
    order = np.argsort(lengths, kind="stable") if sort else np.random.default_rng(seed).permutation(lengths.size)
    lens = lengths[order]
    computed = sum(int(lens[a:a + batch].max()) * lens[a:a + batch].size for a in range(0, lens.size, batch))
    return 1 - int(lengths.sum()) / computed


@pytest.mark.parametrize("seed", [0, 1])
def test_padded_waste_is_at_most_half_of_random_batches(seed, document_stores):
    for lengths in (zipf_lengths(50000, seed=seed, cap=4096), DocumentDataset(document_stores["text"]).lengths):
        max_tokens = 8192 if lengths.size > 1000 else 512
        n_batches, computed = dynamic_waste(lengths, max_tokens, seed=seed)
        dyn = 1 - int(lengths.sum()) / computed
        mean_batch = max(1, lengths.size // n_batches)
        rand = random_batch_waste(lengths, mean_batch, seed)
        # random batches under the same budget: the shuffled order, no sorting, no splitting
        same_budget = plan_batches(lengths, max_tokens, padded=True, window=1, split_gain=1.0,
                                   order=np.random.default_rng(seed).permutation(lengths.size))
        rand_budget = 1 - int(lengths.sum()) / int(same_budget.cost.sum())
        print(f"{lengths.size} docs: dynamic padded waste {dyn:.3f}, random batches of {mean_batch} {rand:.3f}, "
              f"random under the budget {rand_budget:.3f}, sorted {random_batch_waste(lengths, mean_batch, sort=True):.3f}")
        assert dyn <= rand / 2 and dyn <= rand_budget / 2


def test_exact_resume_mid_epoch_through_a_dataloader(document_stores):
    ds = DocumentDataset(document_stores["text"])

    def loader(workers: int) -> ResumableLoader:
        s = DynamicBatchSampler(ds, 600, num_replicas=2, rank=1, seed=9)
        return ResumableLoader(torch.utils.data.DataLoader(ds, batch_sampler=s, num_workers=workers,
                                                           collate_fn=PackedCollator(flatten=True)))

    full = [b["input_ids"] for b in loader(0)]
    first = loader(2)
    it = iter(first)
    got = [next(it)["input_ids"] for _ in range(5)]
    state = first.state_dict()
    del it
    assert state["consumed"] == 5
    again = loader(0)
    again.load_state_dict(state)
    got += [b["input_ids"] for b in again]
    assert len(got) == len(full) and all(torch.equal(a, b) for a, b in zip(got, full, strict=True))
    assert again.sampler.exhausted
    nxt = next(iter(again))  # the next iter() moves to epoch 1 by itself
    assert again.epoch == 1 and nxt["input_ids"].shape[1] > 0


def test_padded_mode_feeds_the_padded_collator(document_stores):
    ds = DocumentDataset(document_stores["pc"])
    s = DynamicBatchSampler(ds, 1024, padded=True, round_to=16, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=s, collate_fn=PaddedCollator(ds.pad_id, round_to=16))
    seen = 0
    for batch in loader:
        b, width = batch["input_ids"].shape
        assert width % 16 == 0 and (b * width <= 1024 or b == 1)
        seen += b
    assert seen == len(ds)


def test_refuses_foreign_state_and_bad_arguments():
    lengths = zipf_lengths(500)
    s = DynamicBatchSampler(lengths, 2048, seed=0)
    with pytest.raises(ConfigError, match="max_tokens"):
        DynamicBatchSampler(lengths, 4096, seed=0).load_state_dict(s.state_dict())
    with pytest.raises(ConfigError, match="DynamicBatchSampler state"):
        s.load_state_dict({"version": 1, "epoch": 0, "consumed": 0})
    with pytest.raises(ConfigError, match="max_tokens"):
        DynamicBatchSampler(lengths, 0)
    with pytest.raises(ConfigError, match="split_gain"):
        DynamicBatchSampler(lengths, 100, split_gain=0)
    with pytest.raises(ConfigError, match="rank"):
        DynamicBatchSampler(lengths, 2048, num_replicas=2, rank=2)
    with pytest.raises(ConfigError, match="ranks"):
        DynamicBatchSampler(np.array([5, 5, 5]), 100, num_replicas=4, rank=0)
    with pytest.raises(ConfigError, match="1-D"):
        DynamicBatchSampler(np.ones((2, 2)), 100)
    dropped = DynamicBatchSampler(lengths, 2048, num_replicas=3, rank=0, drop_last=True)
    assert len(dropped) * 3 <= plan_batches(lengths, 2048, order=np.random.default_rng([0, 0]).permutation(500)).n_batches
