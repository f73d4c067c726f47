"""Balanced data-parallel steps (`PackedSampler(balance=...)`, `packtool.core.balance`).

The invariants, as hypothesis properties over random segment tables and shapes: every pack once per
epoch (today's wrap-around padding), the packs of each window of K steps equal the plain sampler's,
identical plans from fresh samplers, resume equals an uninterrupted run, `balance=None` equals the
sampler before balancing index for index. Then: two real processes agree, a resumed DataLoader
continues exactly, step cost is uncorrelated with step index, and the balanced order reaches the
issue's target on long-tailed lengths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import write_pack_store

from packtool import CostModel, pack_lengths
from packtool.core.balance import (
    DEFAULT_WINDOW,
    balanced_order,
    epoch_order,
    max_displacement,
    step_costs,
    step_efficiency,
)
from packtool.errors import ConfigError
from packtool.loader import PackedCollator, PackedDataset, PackedSampler, ResumableLoader

ROOT = Path(__file__).resolve().parents[1]
MODEL = CostModel.from_shape(4096)


def old_indices(n: int, world: int, rank: int, seed: int, epoch: int, shuffle: bool, drop_last: bool) -> np.ndarray:
    """`PackedSampler.indices` exactly as it was before balancing existed (the pinned reference)."""
    num_samples = n // world if drop_last else -(-n // world)
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    total = num_samples * world
    if total > n:
        order = np.concatenate([order, np.resize(order, total - n)])
    return order[:total][rank::world]


class Table(SimpleNamespace):
    """A pack store's segment table without the store: `pack_offsets`, `seg_lens`, and a length."""

    def __len__(self) -> int:
        return int(self.pack_offsets.size - 1)


def packs_of(seg_counts: list[int], seed: int, long_tail: bool = True) -> Table:
    """A segment table (what a pack store's CSR companions hold) with long-tailed lengths."""
    rng = np.random.default_rng(seed)
    po = np.concatenate(([0], np.cumsum(seg_counts))).astype(np.int64)
    lens = rng.integers(1, 50, size=int(po[-1]))
    if long_tail:
        lens = np.where(rng.random(lens.size) < 0.1, rng.integers(500, 4000, size=lens.size), lens)
    return Table(pack_offsets=po, seg_lens=lens.astype(np.int32))


def real_like_packs(n_tokens: int, size: int, seed: int = 0) -> Table:
    """Packs of a long-tailed (lognormal mixture) corpus, over-long documents split, packed with BFD."""
    rng = np.random.default_rng(seed)
    n = n_tokens // 300
    lens = np.where(rng.random(n) < 0.85, rng.lognormal(np.log(300), 1.0, n), rng.lognormal(np.log(2500), 1.3, n))
    lens = np.maximum(1, lens).astype(np.int64)
    lens = lens[np.cumsum(lens) <= n_tokens]
    items = np.concatenate([np.repeat(size, int((lens // size).sum())), (lens % size)[lens % size > 0]])
    po, order = pack_lengths(items, size, seed=seed)
    return Table(pack_offsets=po, seg_lens=items[order])


# ---- balance=None is today's sampler ---------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 300),
    world=st.integers(1, 9),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_balance_none_is_the_old_sampler_index_for_index(n, world, seed, epoch, shuffle, drop_last):
    if drop_last and n < world:
        return
    packs = packs_of([2] * n, seed=1)
    for rank in {0, world - 1, world // 2}:
        want = old_indices(n, world, rank, seed, epoch, shuffle, drop_last)
        kw = {"num_replicas": world, "rank": rank, "seed": seed, "shuffle": shuffle, "drop_last": drop_last}
        np.testing.assert_array_equal(PackedSampler(n, **kw).indices(epoch), want)
        np.testing.assert_array_equal(PackedSampler(packs, **kw, balance=None, micro_batches=3).indices(epoch), want)


# ---- the invariants of the balanced order ----------------------------------------------


def all_ranks(packs: object, world: int, **kw: object) -> tuple[list[PackedSampler], np.ndarray]:
    """Fresh samplers of every rank and the global order they form (position p: rank p % W)."""
    samplers = [PackedSampler(packs, num_replicas=world, rank=r, balance=MODEL, **kw) for r in range(world)]
    shares = [s.indices() for s in samplers]
    glob = np.empty(sum(x.size for x in shares), np.int64)
    for r, share in enumerate(shares):
        glob[r::world] = share
    return samplers, glob


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=240),
    world=st.integers(1, 8),
    micro=st.integers(1, 3),
    window=st.integers(1, 7),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 3),
    drop_last=st.booleans(),
)
def test_balanced_order_invariants(counts, world, micro, window, seed, epoch, drop_last):
    n = len(counts)
    if drop_last and n < world:
        return
    packs = packs_of(counts, seed=seed % 1000)
    kw = {"seed": seed, "micro_batches": micro, "window": window, "drop_last": drop_last}
    samplers, glob = all_ranks(packs, world, **kw)
    for s in samplers:
        s.set_epoch(epoch)
    shares = [s.indices() for s in samplers]
    for r, share in enumerate(shares):
        glob[r::world] = share
    plain = epoch_order(n, seed, epoch, world=world, drop_last=drop_last)
    # every pack once per epoch, with the plain sampler's padding (wrap-around repeats) or cut
    assert glob.size == plain.size and sorted(glob.tolist()) == sorted(plain.tolist())
    if not drop_last:
        assert set(glob.tolist()) == set(range(n))
    # the packs of steps [jK, (j+1)K) over all ranks are the plain sampler's
    span = window * world * micro
    for a in range(0, plain.size, span):
        assert sorted(glob[a : a + span].tolist()) == sorted(plain[a : a + span].tolist())
    assert max_displacement(plain, glob, world, micro) <= window - 1
    # deterministic for (seed, epoch): a fresh sampler plans the same, another epoch differs in general
    again = PackedSampler(packs, num_replicas=world, rank=world - 1, balance=MODEL, **kw)
    np.testing.assert_array_equal(again.indices(epoch), shares[-1])
    # with one micro-batch the grouped steps never take longer than the plain ones (sorted groups
    # minimise the sum of the per-step maxima inside each window)
    costs = samplers[0].costs
    assert costs is not None
    if micro == 1:
        plain_time = step_costs(plain, costs, world).max(axis=1).sum()
        assert step_costs(glob, costs, world).max(axis=1).sum() <= plain_time * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 150),
    world=st.integers(1, 5),
    micro=st.integers(1, 3),
    data=st.data(),
)
def test_resume_equals_an_uninterrupted_run(n, world, micro, data):
    packs = packs_of([3] * n, seed=n)
    rank = data.draw(st.integers(0, world - 1))
    kw = {"num_replicas": world, "rank": rank, "seed": 11, "balance": MODEL, "micro_batches": micro, "window": 4}
    reference = PackedSampler(packs, **kw)
    full = list(reference) + (reference.set_epoch(1) or list(reference))  # two epochs uninterrupted
    k = data.draw(st.integers(0, len(full)))
    first = PackedSampler(packs, **kw)
    epoch_len = len(first)
    done = min(k, epoch_len)
    first.advance(done)
    if k > epoch_len:
        first.set_epoch(1)
        first.advance(k - epoch_len)
    resumed = PackedSampler(packs, **kw)
    resumed.load_state_dict(first.state_dict())
    rest = list(resumed)
    if resumed.epoch == 0:
        resumed.set_epoch(1)
        rest += list(resumed)
    assert full[:k] + rest == full


def test_state_refuses_another_balance_or_window():
    packs = packs_of([2] * 40, seed=0)
    s = PackedSampler(packs, num_replicas=2, rank=0, balance=MODEL, window=4)
    state = s.state_dict()
    assert state["balance"] == MODEL.to_dict() and state["window"] == 4
    with pytest.raises(ConfigError, match="balance=.* but this sampler has None"):
        PackedSampler(packs, num_replicas=2, rank=0).load_state_dict(state)
    with pytest.raises(ConfigError, match="window=4 but this sampler has 8"):
        PackedSampler(packs, num_replicas=2, rank=0, balance=MODEL, window=8).load_state_dict(state)
    plain = PackedSampler(40, num_replicas=2, rank=0).state_dict()
    for key in ("balance", "micro_batches", "window"):  # a checkpoint from before balancing
        plain.pop(key)
    PackedSampler(40, num_replicas=2, rank=0, micro_batches=2).load_state_dict(plain)


def test_bad_arguments_are_refused():
    with pytest.raises(ConfigError, match="needs each pack's segment lengths"):
        PackedSampler(40, balance=MODEL)
    with pytest.raises(ConfigError, match="must be a packtool.CostModel"):
        PackedSampler(packs_of([1] * 5, 0), balance="flops")  # type: ignore[arg-type]
    table = packs_of([1] * 5, 0)
    pair = PackedSampler(table, balance=(2.0, 0.5), num_replicas=2)  # a pair or any object with the two fields
    assert pair.balance == CostModel(2.0, 0.5)
    assert PackedSampler(table, balance=SimpleNamespace(per_token=2, per_token_sq=0.5), num_replicas=2).balance == pair.balance
    with pytest.raises(ConfigError, match="window must be an integer >= 1"):
        PackedSampler(40, window=0)
    with pytest.raises(ConfigError, match="micro_batches must be an integer >= 1"):
        PackedSampler(40, micro_batches=0)
    with pytest.raises(ConfigError, match="describes 5 packs but the sampler has 4"):
        short = type("Short", (Table,), {"__len__": lambda self: 4})
        PackedSampler(short(pack_offsets=np.arange(6), seg_lens=np.ones(5)), balance=MODEL)


# ---- what balancing buys, and what it must not do --------------------------------------


@pytest.mark.parametrize(("size", "micro"), [(4096, 1), (16384, 1), (16384, 2)])
def test_target_efficiency_on_long_tailed_lengths(size, micro):
    """The issue's target at W = 8 with the default window: mean >= 99.5%, 5th percentile >= 98%."""
    packs = real_like_packs(12_000_000, size)
    costs = MODEL.packs(packs.pack_offsets, packs.seg_lens)
    n = costs.size
    plain = epoch_order(n, 0, 0, world=8)
    balanced = balanced_order(plain, costs, world=8, micro_batches=micro, window=DEFAULT_WINDOW)
    before = step_efficiency(step_costs(plain, costs, 8, micro))
    after = step_efficiency(step_costs(balanced, costs, 8, micro))
    assert before.mean < 0.995  # the plain order is not already balanced
    assert after.mean >= 0.995 and after.p5 >= 0.98
    assert after.step_time < before.step_time


def test_step_cost_is_uncorrelated_with_step_index():
    packs = real_like_packs(20_000_000, 4096, seed=3)
    costs = MODEL.packs(packs.pack_offsets, packs.seg_lens)
    plain = epoch_order(costs.size, 5, 0, world=8)
    balanced = balanced_order(plain, costs, world=8, seed=5)
    step_cost = step_costs(balanced, costs, 8).max(axis=1)[:-1]  # the last step may be a short one
    index = np.arange(step_cost.size)
    assert abs(np.corrcoef(index, step_cost)[0, 1]) < 0.1
    sorted_globally = step_costs(plain[np.argsort(-costs[plain], kind="stable")], costs, 8).max(axis=1)[:-1]
    assert abs(np.corrcoef(index, sorted_globally)[0, 1]) > 0.5  # what the check exists to catch
    # inside a window the steps are shuffled too: the heaviest step of a window is not always first
    firsts = step_cost[: step_cost.size // DEFAULT_WINDOW * DEFAULT_WINDOW].reshape(-1, DEFAULT_WINDOW).argmax(axis=1)
    assert np.unique(firsts).size > 1


# ---- real pack stores, real processes, a real DataLoader -------------------------------


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    rng = np.random.default_rng(4)
    lens = np.where(rng.random(700) < 0.9, rng.integers(1, 60, 700), rng.integers(200, 512, 700))
    docs = [rng.integers(2, 500, size=int(k)) for k in lens]
    d = tmp_path_factory.mktemp("balance") / "packed"
    return d, write_pack_store(d, docs, 512)


@pytest.fixture(scope="module")
def store(written: tuple[Path, list]) -> Path:
    return written[0]


@pytest.fixture(scope="module")
def store_segments(written: tuple[Path, list]) -> list:
    return written[1]


CHILD = """
import json, sys
from packtool import CostModel
from packtool.loader import PackedDataset, PackedSampler
ds = PackedDataset(sys.argv[1])
shares = []
for rank in map(int, sys.argv[2:]):
    s = PackedSampler(ds, num_replicas=4, rank=rank, seed=7, balance=CostModel.from_shape(512), micro_batches=2,
                      window=3)
    s.set_epoch(2)
    shares.append(s.indices().tolist())
print(json.dumps(shares))
"""


def test_ranks_built_in_separate_processes_agree(store):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [  # two processes at once, each building two ranks
        subprocess.Popen([sys.executable, "-c", CHILD, str(store), *ranks], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**env, "PYTHONHASHSEED": ranks[0]})
        for ranks in (["0", "2"], ["3", "1"])
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    (r0, r2), (r3, r1) = (json.loads(o) for o, _ in outs)
    shares = [r0, r1, r2, r3]
    ds = PackedDataset(store)
    here = [PackedSampler(ds, num_replicas=4, rank=r, seed=7, balance=CostModel.from_shape(512), micro_batches=2,
                          window=3) for r in range(4)]
    for s in here:
        s.set_epoch(2)
    assert shares == [s.indices().tolist() for s in here]
    flat = np.concatenate(shares)
    assert set(flat.tolist()) == set(range(len(ds)))  # together: every pack of the epoch
    plain = [PackedSampler(ds, num_replicas=4, rank=r, seed=7) for r in range(4)]
    assert shares != [(p.set_epoch(2) or p.indices()).tolist() for p in plain]  # balancing did reorder


def test_a_resumed_loader_continues_exactly(store):
    ds = PackedDataset(store)

    def loader() -> ResumableLoader:
        sampler = PackedSampler(ds, num_replicas=2, rank=1, seed=3, balance=CostModel.from_shape(512), micro_batches=2,
                                window=4)
        return ResumableLoader(torch.utils.data.DataLoader(ds, batch_size=2, sampler=sampler,
                                                           collate_fn=PackedCollator(flatten=True)))

    def key(batch: dict) -> tuple:
        return tuple(batch["cu_seqlens"].tolist()) + tuple(batch["input_ids"].reshape(-1)[::7].tolist())

    full = loader()
    reference = [key(b) for b in full] + [key(b) for b in full]
    for k in (1, 5, len(reference) // 2 + 1):
        first = loader()
        seen: list[tuple] = []
        it = iter(first)
        while len(seen) < k:
            try:
                seen.append(key(next(it)))
            except StopIteration:
                it = iter(first)
        resumed = loader()
        resumed.load_state_dict(first.state_dict())
        rest: list[tuple] = []
        while len(seen) + len(rest) < len(reference):
            rest.extend(key(b) for b in resumed)
        assert seen + rest == reference, f"resume after {k} batches"


def test_pack_costs_come_from_the_stores_segment_table(store, store_segments):
    """The sampler prices pack p from the CSR companions: the segments the writer put in pack p."""
    model = CostModel(3.0, 0.25)
    s = PackedSampler(PackedDataset(store), balance=model)
    assert s.costs is not None
    want = np.zeros(s.n)
    for seg in store_segments:
        want[seg.pack] += model.document(seg.tokens.size + seg.pad)
    np.testing.assert_allclose(s.costs, want, rtol=1e-12)


# ---- documents: DynamicBatchSampler(balance=...) ---------------------------------------


def long_tailed_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lens = np.where(rng.random(n) < 0.85, rng.lognormal(np.log(300), 1.0, n), rng.lognormal(np.log(2500), 1.3, n))
    return np.minimum(lens, 16384).astype(np.int64)


@pytest.mark.parametrize("padded", [False, True])
def test_dynamic_batches_are_dealt_by_cost(padded):
    """Same batches (the token budget decides them), dealt to ranks by the model's cost: every step
    waits less under that model than when the batches are dealt by token count."""
    from packtool.core.batching import priced
    from packtool.loader import DynamicBatchSampler

    lens = long_tailed_lengths(8000)
    kw = {"num_replicas": 8, "padded": padded, "seed": 2}
    by_tokens = [DynamicBatchSampler(lens, 16384, rank=r, **kw) for r in range(8)]
    by_cost = [DynamicBatchSampler(lens, 16384, rank=r, balance=MODEL, **kw) for r in range(8)]
    batches = lambda ss: sorted(tuple(b) for s in ss for b in s.batches())  # noqa: E731
    assert batches(by_tokens) == batches(by_cost)
    docs = np.concatenate([np.concatenate([np.asarray(b, np.int64) for b in s.batches()]) for s in by_cost])
    assert sorted(docs.tolist()) == list(range(lens.size))  # every document once
    steps, plan = by_tokens[0]._steps(0)
    token_dealt = priced(plan, lens, MODEL, padded, 1)[steps]  # the token-balanced steps, priced by the model
    cost_dealt = by_cost[0].costs()
    assert list(by_cost[3]) == by_cost[3].batches()
    for step, batch in enumerate(by_cost[3].batches()):  # costs() is the model's price of what rank 3 gets
        rounded = lens[batch]
        want = len(batch) * MODEL.document(rounded.max()) if padded else MODEL.document(rounded).sum()
        assert cost_dealt[step, 3] == pytest.approx(want, rel=1e-12)
    before, after = step_efficiency(token_dealt), step_efficiency(cost_dealt)
    assert after.step_time < before.step_time and after.mean > before.mean


def test_dynamic_state_carries_the_cost_model():
    from packtool.loader import DynamicBatchSampler

    lens = long_tailed_lengths(500)
    s = DynamicBatchSampler(lens, 8192, balance=MODEL, num_replicas=2, rank=0)
    s.advance(3)
    state = s.state_dict()
    with pytest.raises(ConfigError, match="balance=.* but this sampler has None"):
        DynamicBatchSampler(lens, 8192, num_replicas=2, rank=0).load_state_dict(state)
    resumed = DynamicBatchSampler(lens, 8192, balance=MODEL, num_replicas=2, rank=0)
    resumed.load_state_dict(state)
    assert list(resumed) == s.batches()[3:]
    old = DynamicBatchSampler(lens, 8192, num_replicas=2, rank=0).state_dict()
    old.pop("balance")  # a checkpoint from before cost balancing resumes a plain sampler
    DynamicBatchSampler(lens, 8192, num_replicas=2, rank=0).load_state_dict(old)
    with pytest.raises(ConfigError, match="must be a packtool.CostModel"):
        DynamicBatchSampler(lens, 8192, balance="flops")  # type: ignore[arg-type]
