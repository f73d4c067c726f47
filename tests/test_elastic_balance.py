"""Elastic resume of a balanced `PackedSampler` mid-window (issue 33's last gap).

A state taken at W ranks after c indices per rank (mid-window) loads at W' ranks: the interrupted window's
packs not consumed yet are re-dealt, balanced, over the W' ranks (the head window), then the following
windows come as W' deals them. Checked: the multiset of everything yielded before and after is one epoch
(none lost, none twice; only the end-of-epoch padding or cut of either layout), at a window boundary it is
exactly the plain elastic resume, chains of resumes, the lazy path, balance of the head window, real
stores and a blend through `ResumableLoader`, and refusals."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import write_pack_store, zipf_docs
from test_balance import MODEL, packs_of, real_like_packs

import packtool.loader.sampler as sampler_module
from packtool.core.balance import step_costs
from packtool.errors import ConfigError
from packtool.formats.pack_store import metadata_for, write_metadata_line
from packtool.loader import BlendedDataset, PackedDataset, PackedSampler, ResumableLoader

SIZE = 64


def ranks(data, world: int, **kw) -> list[PackedSampler]:
    return [PackedSampler(data, num_replicas=world, rank=r, **kw) for r in range(world)]


def consume(samplers: list[PackedSampler], c: int) -> list[int]:
    """Every rank takes its first `c` indices (left to its position); returns them, all ranks together."""
    taken = [x for s in samplers for x in list(s)[:c]]
    for s in samplers:
        s.advance(c)
    return taken


def resume(data, state: dict, world: int, **kw) -> list[PackedSampler]:
    new = ranks(data, world, **kw)
    for s in new:
        s.load_state_dict(state)
    return new


def check_epoch(got: list[int], n: int, slack: int, drop_last: bool) -> None:
    """`got` (pack indices) is one epoch: every pack once, plus (or, with drop_last, minus) fewer than `slack`
    wrap-around repeats (or cuts) at the epoch's end."""
    count = Counter(got)
    assert set(count) <= set(range(n))
    if drop_last:
        assert max(count.values(), default=1) == 1 and n - len(count) < slack  # none twice; the cuts only
    else:
        assert len(count) == n and len(got) - n < slack  # none lost; the padding only


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 160),
    old=st.integers(1, 6),
    new=st.integers(1, 6),
    third=st.integers(1, 6),
    micro=st.integers(1, 3),
    window=st.integers(1, 5),
    drop_last=st.booleans(),
    lazy=st.booleans(),
    data=st.data(),
)
def test_mid_window_moves_lose_and_repeat_nothing(n, old, new, third, micro, window, drop_last, lazy, data):
    if drop_last and n < max(old, new, third):
        return
    saved = sampler_module.LAZY_ABOVE
    sampler_module.LAZY_ABOVE = 0 if lazy else saved  # the lazy path plans one window at a time
    try:
        packs = packs_of([3] * n, seed=n)
        kw = {"seed": 5, "balance": MODEL, "micro_batches": micro, "window": window, "drop_last": drop_last}
        olds = ranks(packs, old, **kw)
        assert olds[0].lazy == lazy
        c = data.draw(st.integers(0, olds[0].num_samples), label="consumed at W")
        before = consume(olds, c)
        state = olds[0].state_dict()
        news = resume(packs, state, new, **kw)
        lengths = {len(s) for s in news}
        assert len(lengths) == 1  # every new rank has as many steps left
        assert news[0].global_sample == c * old
        again = resume(packs, json.loads(json.dumps(state)), new, **kw)  # deterministic, and JSON-safe
        assert [list(s) for s in again] == [list(s) for s in news]
        boundary = c % (window * micro) == 0
        if boundary and new != old:  # exactly today's resume at a boundary: base moves by c·W
            plain = resume(packs, {**state, "num_replicas": new, "consumed": 0, "base": c * old}, new, **kw)
            assert "head" not in news[0].state_dict()
            assert [list(s) for s in news] == [list(s) for s in plain]
        d = data.draw(st.integers(0, len(news[0])), label="consumed at W'")
        mid = consume(news, d)
        state2 = news[0].state_dict()
        same = resume(packs, state2, new, **kw)  # the same world size: exactly where it was
        assert [list(s) for s in same] == [list(s)[d:] for s in resume(packs, state, new, **kw)]
        last = resume(packs, state2, third, **kw)  # a second move, maybe inside the head window
        after = [x for s in last for x in list(s)]
        assert last[0].global_sample == c * old + d * new
        check_epoch(before + mid + after, n, old + new + third, drop_last)
        assert len(json.dumps(state2)) < 1200  # a few ints per move: never positions
    finally:
        sampler_module.LAZY_ABOVE = saved


@pytest.mark.parametrize("lazy", [False, True])
def test_global_sample_survives_a_move_onto_a_window_boundary_after_a_head(lazy: bool) -> None:
    """Found by the property test above under other seeds: 55 packs, 6 ranks took 9 (54), 4 ranks then took 1 of
    the re-dealt head (58), and the move to 1 rank, at a window boundary, said global_sample 60 (the head
    layout's end position, padding included), not 58."""
    saved = sampler_module.LAZY_ABOVE
    sampler_module.LAZY_ABOVE = 0 if lazy else saved
    try:
        packs = packs_of([3] * 55, seed=55)
        kw = {"seed": 5, "balance": MODEL, "micro_batches": 1, "window": 2}
        olds = ranks(packs, 6, **kw)
        before = consume(olds, 9)
        news = resume(packs, olds[0].state_dict(), 4, **kw)
        assert news[0].global_sample == 54
        mid = consume(news, 1)
        assert news[0].global_sample == 58
        last = resume(packs, news[0].state_dict(), 1, **kw)
        assert last[0].global_sample == 58
        again = resume(packs, json.loads(json.dumps(last[0].state_dict())), 3, **kw)
        assert again[0].global_sample == 58
        check_epoch(before + mid + [x for s in last for x in list(s)], 55, 6 + 4 + 1, False)
    finally:
        sampler_module.LAZY_ABOVE = saved


def head_steps(samplers: list[PackedSampler]) -> np.ndarray:
    """`[steps, W]` costs of the head window's steps of resumed ranks."""
    s = samplers[0]
    assert s.costs is not None
    _, h0, _, _ = s._span(s.epoch)
    glob = np.empty(h0, np.int64)
    for r, t in enumerate(samplers):
        glob[r :: len(samplers)] = t.indices()[: h0 // len(samplers)]
    return step_costs(glob, s.costs, len(samplers), s.micro_batches)


@pytest.mark.parametrize("new", [2, 3])
def test_four_ranks_mid_window_to_two_and_three(new):
    packs = real_like_packs(3_000_000, 4096)
    n, micro, window = len(packs), 2, 16
    kw = {"seed": 1, "balance": MODEL, "micro_batches": micro, "window": window}
    olds = ranks(packs, 4, **kw)
    steps = window + 5  # window 1, 5 of its 16 steps consumed
    before = consume(olds, steps * micro)
    state = olds[0].state_dict()
    assert state["global_sample"] == steps * 4 * micro and state["version"] == 1
    news = resume(packs, state, new, **kw)
    moved = news[0].state_dict()
    assert moved["version"] == 2 and moved["global_sample"] == state["global_sample"]
    assert {k: v for k, v in moved["head"].items() if k != "digest"} == {
        "num_replicas": 4,
        "base": 0,
        "consumed": steps * micro,
        "head": None,
    }
    after = [x for s in news for x in list(s)]
    check_epoch(before + after, n, 4 + new, drop_last=False)
    # the head is window 1's 11 remaining steps of 4 ranks (88 packs), re-dealt over `new` ranks
    head = news[0]._head(0)
    plain = olds[0]._values(0, np.arange(window * 4 * micro, 2 * window * 4 * micro))
    window1 = set(plain.tolist())
    assert set(olds[0]._values(0, head).tolist()) <= window1 and head.size == 11 * 4 * micro
    # balanced within the head window: each step's rank costs spread less than the window's largest pack,
    # and far less than the plain order's steps
    costs = news[0].costs
    assert costs is not None
    per = head_steps(news)
    spread = per.max(axis=1) - per.min(axis=1)
    dealt = news[0]._values(0, news[0]._head_window(0)[0])  # the head window: the head and a few plain packs
    assert spread.max() <= costs[dealt].max()
    plain_steps = step_costs(plain[: per.size * micro], costs, new, micro)
    assert spread.mean() < 0.5 * (plain_steps.max(axis=1) - plain_steps.min(axis=1)).mean()
    eff = per.mean(axis=1) / per.max(axis=1)
    assert eff.mean() >= 0.97, eff


def make_store(directory: Path, n_docs: int, seed: int) -> Path:
    write_pack_store(directory, zipf_docs(n_docs, seed=seed, max_len=SIZE - 4), SIZE)
    meta = metadata_for(directory, "training", SIZE)
    meta["tokenizer"] = {"name": "org/tiny-tok", "sha256": "a" * 64}
    write_metadata_line(directory, meta)
    return directory


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("elastic")
    return [make_store(root / f"s{i}", n, seed=i) for i, n in enumerate((60, 90, 30))]


class Indexed(torch.utils.data.Dataset):
    """A plain dataset's items (read for real) with their index, so batches can be told apart."""

    def __init__(self, ds: PackedDataset) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict:
        return {"index": i, "input_ids": self.ds[i]["input_ids"]}


def keys(items: list[dict]) -> list[tuple[int, int]]:
    return [(int(it["source"]), int(it["source_index"])) if "source" in it else (-1, int(it["index"])) for it in items]


@pytest.mark.parametrize("blend", [False, True])
@pytest.mark.parametrize("new", [2, 3])
def test_resumable_loader_round_trip_over_stores_and_a_blend(stores, blend, new):
    ds = (
        BlendedDataset([(stores[0], 1), (stores[1], 1.5), (stores[2], 2)], seed=3)
        if blend
        else PackedDataset(stores[1])
    )
    kw = {"seed": 2, "balance": MODEL, "micro_batches": 2, "window": 3}
    ids = PackedSampler(ds, num_replicas=1, rank=0, **kw).indices()  # world 1: the plain order, every sample once

    def loader(world: int, rank: int) -> ResumableLoader:
        sampler = PackedSampler(ds, num_replicas=world, rank=rank, **kw)
        items = ds if blend else Indexed(ds)
        return ResumableLoader(torch.utils.data.DataLoader(items, batch_size=2, sampler=sampler, collate_fn=keys))

    def item_key(i: int) -> tuple[int, int]:
        return keys([ds[int(i)]])[0] if blend else (-1, int(i))

    olds = [loader(4, r) for r in range(4)]
    its = [iter(x) for x in olds]
    before = [k for it in its for _ in range(2) for k in next(it)]  # 2 steps of a 3-step window
    state = olds[0].state_dict()
    news = [loader(new, r) for r in range(new)]
    for x in news:
        x.load_state_dict(state)
    mid_its = [iter(x) for x in news]
    mid = [k for it in mid_its for k in next(it)]  # one step inside the head window
    state2 = news[0].state_dict()
    assert "head" in state2
    rest = []
    for r in range(new):  # the same world size from the saved state: exactly the batches left
        x = loader(new, r)
        x.load_state_dict(state2)
        got = [k for b in x for k in b]
        assert got == [k for b in mid_its[r] for k in b]
        rest += got
    want = Counter(item_key(i) for i in ids)
    have = Counter(before + mid + rest)
    assert set(have) == set(want) and sum(have.values()) - sum(want.values()) < 4 + new  # padding only
    x = loader(new, 0)
    x.load_state_dict(news[0].state_dict())  # exhausted: the next iter() is epoch 1 at the new world size
    assert x.sampler.exhausted and next(iter(x)) and x.epoch == 1


def test_a_state_from_another_dataset_or_a_malformed_head_is_refused(stores):
    a, same_n, c = (PackedDataset(x) for x in stores)
    assert len(a) == len(same_n) != len(c)
    kw = {"seed": 2, "balance": MODEL, "micro_batches": 2, "window": 3}
    olds = ranks(a, 4, **kw)
    consume(olds, 3)
    moved = resume(a, olds[0].state_dict(), 2, **kw)[0].state_dict()
    assert moved["version"] == 2 and "digest" in moved["head"]
    with pytest.raises(ConfigError, match=r"sampler state has n=\d+ but this sampler has \d+"):
        PackedSampler(c, num_replicas=3, rank=0, **kw).load_state_dict(moved)
    # the same pack count and seed, other packs: the rebuilt interrupted window does not match the state's
    for world in (2, 3):
        with pytest.raises(ConfigError, match="interrupted window holds other packs or costs here"):
            PackedSampler(same_n, num_replicas=world, rank=0, **kw).load_state_dict(moved)
    blend = BlendedDataset([(stores[0], 1)], seed=0)
    with pytest.raises(ConfigError, match="state is of a plain dataset but this sampler reads blend"):
        PackedSampler(blend, num_replicas=3, rank=0, **kw).load_state_dict(moved)
    bad = {**moved, "head": {**moved["head"], "consumed": -1}}
    with pytest.raises(ConfigError, match="malformed head .* resume from the state the sampler wrote"):
        PackedSampler(a, num_replicas=3, rank=0, **kw).load_state_dict(bad)
    with pytest.raises(ConfigError, match="sampler state has balance=.* but this sampler has None"):
        PackedSampler(a, num_replicas=3, rank=0, seed=2).load_state_dict(moved)
