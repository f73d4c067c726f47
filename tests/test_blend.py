"""`BlendedDataset`: exact counts per weight, the stores' own items, the prefix bound on every prefix,
determinism, new draws per epoch, rank interleaving, elastic resume, and bad input (API and CLI)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from support import cli, cli_error, write_pack_store, zipf_docs

from packtool.core.blend import Interleave, permute
from packtool.errors import ConfigError
from packtool.formats.pack_store import metadata_for, open_pack_split, write_metadata_line
from packtool.loader import (
    BlendedDataset,
    CostModel,
    PackedCollator,
    PackedDataset,
    PackedSampler,
    ResumableLoader,
)

SIZE = 64
TOKENIZER = {"name": "org/tiny-tok", "sha256": "a" * 64}


def make_store(directory: Path, n_docs: int, seed: int, size: int = SIZE, tokenizer: dict | None = None) -> Path:
    write_pack_store(directory, zipf_docs(n_docs, seed=seed, max_len=size - 4), size)
    meta = metadata_for(directory, "training", size)
    meta["tokenizer"] = tokenizer or TOKENIZER
    write_metadata_line(directory, meta)
    return directory


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("blend")
    return [make_store(root / f"s{i}", n, seed=i) for i, n in enumerate((20, 70, 9, 35))]


def schedule(ds: BlendedDataset, epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return ds.index(0, len(ds), epoch=epoch)


def test_exact_counts_per_weight_and_each_store_in_passes(stores):
    weights = [1, 2.5, 0.6, 3.15]  # 0.3 of store 2's one pack was no sample (refused now)
    ds = BlendedDataset([(s, w) for s, w in zip(stores, weights, strict=True)], seed=7)
    src, packs = schedule(ds)
    for s, w in enumerate(weights):
        n = int(ds.n_packs[s])
        k, m = math.floor(w), math.floor((round(w - math.floor(w), 10)) * n + 0.5)
        assert int(ds.counts[s]) == k * n + m == int(np.sum(src == s))
        mine = packs[src == s]  # in schedule order: k full passes, then m distinct packs
        for p in range(k):
            assert sorted(mine[p * n : (p + 1) * n].tolist()) == list(range(n))
        tail = mine[k * n :]
        assert tail.size == m and np.unique(tail).size == m
        assert n == 1 or mine[:n].tolist() != list(range(n)), "each store's packs come in a seeded order"


def test_items_are_the_stores_own_items(stores):
    ds = BlendedDataset([f"{stores[0]}:1", f"{stores[1]}:0.5", f"{stores[2]}:2"], seed=1)
    own = [PackedDataset(s) for s in stores]
    keys = list(range(0, len(ds), 3))[:12]
    batch = ds.__getitems__(keys)  # several stores in one batch: merged into one build_batch layout
    src, packs = ds.locate(np.array(keys))
    for b, key in enumerate(keys):
        item, alone = batch[b], ds[key]
        ref = own[int(src[b])][int(packs[b])]
        assert item["source"] == alone["source"] == src[b] and item["source_index"] == int(packs[b])
        for name, value in ref.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(item[name], value) and torch.equal(alone[name], value), name
            else:
                assert item[name] == value, name
    lru = BlendedDataset([f"{stores[0]}:1", f"{stores[1]}:0.5", f"{stores[2]}:2"], seed=1, max_open=1)
    for _ in range(2):  # opened once through PackedDataset, then re-mapped from the recorded layout
        for key in keys:
            item, ref = lru[key], ds[key]
            assert all(torch.equal(item[k], ref[k]) for k in ref if isinstance(ref[k], torch.Tensor))
    assert len(lru._open) == 1 and len(lru._layouts) == len(set(src.tolist())) > 1
    merged = PackedCollator()(batch)
    separate = PackedCollator()([ds[k] for k in keys])
    for name in ("input_ids", "labels", "position_ids", "cu_seqlens"):
        assert torch.equal(merged[name], separate[name]), name


def prefix_deviation(il: Interleave, epoch: int = 0) -> float:
    src, occ = il.locate(np.arange(il.total), epoch)
    assert np.array_equal(np.bincount(src, minlength=il.counts.size), il.counts)
    for s in np.flatnonzero(il.counts).tolist():  # occurrences of a store are counted in order
        assert np.array_equal(occ[src == s], np.arange(il.counts[s]))
    worst, running = 0.0, np.zeros(il.counts.size, np.int64)
    share = il.counts / il.total
    for a in range(0, il.total, 4096):  # every prefix, a block at a time
        block = src[a : a + 4096]
        hits = np.zeros((block.size, il.counts.size), np.int64)
        hits[np.arange(block.size), block] = 1
        cum = np.cumsum(hits, axis=0) + running
        t = np.arange(a + 1, a + block.size + 1)[:, None]
        worst = max(worst, float(np.abs(cum - t * share).max()))
        running = cum[-1]
    return worst


FIB = [1, 1]
while len(FIB) < 22:
    FIB.append(FIB[-1] + FIB[-2])


@pytest.mark.parametrize(
    "counts",
    [
        [3, 5],
        [1, 60_000, 2, 1],  # tiny beside huge
        FIB,  # the deepest Huffman tree there is
        [2**i for i in range(15)],
        [500] * 40,
        np.random.default_rng(3).integers(1, 2000, 60).tolist(),
        [0, 7, 0, 11],  # stores whose weight rounds to no pack
    ],
)
def test_every_prefix_keeps_each_store_within_two_samples_of_its_share(counts):
    for seed, epoch in ((0, 0), (5, 3)):
        assert prefix_deviation(Interleave(np.array(counts), seed), epoch) < 2


def test_prefix_bound_through_real_stores_and_prefix_counts(stores):
    # 0.1 of store 0's packs is one sample (0.05 was none: refused now)
    ds = BlendedDataset([(stores[0], 0.1), (stores[1], 40), (stores[2], 1), (stores[3], 0.5)], seed=2)
    assert prefix_deviation(ds.interleave) < 2
    src, _ = schedule(ds)
    for t in (0, 1, 17, len(ds) // 2, len(ds)):
        assert np.array_equal(ds.prefix_counts(t), np.bincount(src[:t], minlength=4))


def test_permute_is_a_bijection_for_any_n():
    for n in (1, 2, 3, 7, 64, 1000, 4099):
        for key in (0, 12345):
            assert sorted(permute(np.arange(n), n, key).tolist()) == list(range(n))
    big = permute(np.array([0, 10**12 - 1]), 10**12, 9)
    assert np.all((big >= 0) & (big < 10**12))


def test_deterministic_for_a_seed_and_a_new_draw_per_epoch(stores):
    spec = [(stores[0], 1), (stores[1], 1.5), (stores[3], 2)]
    a, b = BlendedDataset(spec, seed=4), BlendedDataset(spec, seed=4)
    for epoch in (0, 1):
        assert all(np.array_equal(x, y) for x, y in zip(schedule(a, epoch), schedule(b, epoch), strict=True))
    other = BlendedDataset(spec, seed=5)
    assert not np.array_equal(schedule(a)[1], schedule(other)[1])
    e0, e1 = schedule(a, 0), schedule(a, 1)
    assert not np.array_equal(e0[1], e1[1])  # new store orders; the interleave flips seeded coins per node
    assert any(not np.array_equal(e0[0], schedule(a, e)[0]) for e in range(1, 6))
    assert np.array_equal(np.bincount(e0[0]), np.bincount(e1[0]))  # same counts, new draw
    sampler = PackedSampler(a, num_replicas=1, rank=0)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert first == list(range(len(a))) and second == list(range(len(a), 2 * len(a)))
    assert np.array_equal(a.locate(np.array(second))[1], e1[1])


def test_ranks_interleave_the_global_order(stores):
    ds = BlendedDataset([(stores[0], 1), (stores[1], 1)], seed=0)
    world = 3
    shares = [list(PackedSampler(ds, num_replicas=world, rank=r)) for r in range(world)]
    per = -(-len(ds) // world)
    assert all(len(s) == per for s in shares)
    flat = [shares[r][k] for k in range(per) for r in range(world)]
    assert flat[: len(ds)] == list(range(len(ds)))  # padding wraps to the epoch's first samples
    assert flat[len(ds) :] == list(range(len(flat) - len(ds)))


@pytest.mark.parametrize(("old", "new", "steps"), [(4, 2, 37), (2, 3, 11), (3, 3, 5)])
def test_elastic_resume_continues_at_the_same_global_sample(stores, old, new, steps):
    ds = BlendedDataset([(stores[1], 8), (stores[3], 6)], seed=1)
    assert len(ds) >= 4 * 37 + 8
    states = []
    for r in range(old):
        s = PackedSampler(ds, num_replicas=old, rank=r)
        s.advance(steps)
        states.append(s.state_dict())
    g = old * steps
    assert states[0]["global_sample"] == g
    resumed = []
    for r in range(new):
        s = PackedSampler(ds, num_replicas=new, rank=r)
        s.load_state_dict(states[0])  # any rank's state: they agree on the global sample
        resumed.append(list(s))
    assert resumed[0][0] == g and all(resumed[r][0] == g + r for r in range(new))
    flat = [resumed[r][k] for k in range(len(resumed[0])) for r in range(new)]
    assert flat[: len(ds) - g] == list(range(g, len(ds)))  # nothing skipped, nothing repeated
    s.set_epoch(1)  # the next epoch starts from its first sample at the new world size
    assert list(s)[:2] == [len(ds) + new - 1, len(ds) + 2 * new - 1]


def test_elastic_resume_of_a_plain_dataset_keeps_the_order():
    n = 103
    s = PackedSampler(n, num_replicas=4, rank=0, seed=3)
    order = s.order().tolist()
    s.advance(10)
    state = s.state_dict()
    two = [PackedSampler(n, num_replicas=2, rank=r, seed=3) for r in range(2)]
    for t in two:
        t.load_state_dict(state)
    got = [list(t) for t in two]
    assert [got[r][k] for k in range(len(got[1])) for r in range(2)][: n - 40] == order[40:n]
    again = PackedSampler(n, num_replicas=2, rank=1, seed=3)
    again.load_state_dict(two[1].state_dict())  # same world: where it was
    assert list(again) == got[1]


def test_resumable_loader_with_balance_over_a_blend(stores):
    ds = BlendedDataset([(stores[0], 1), (stores[1], 1), (stores[2], 3)], seed=0)
    model = CostModel.from_shape(256)

    def loader(rank: int) -> ResumableLoader:
        sampler = PackedSampler(ds, num_replicas=2, rank=rank, balance=model, micro_batches=2, window=4)
        return ResumableLoader(
            torch.utils.data.DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=PackedCollator())
        )

    full = [b["input_ids"].clone() for b in loader(1)]
    shares = [
        PackedSampler(ds, num_replicas=2, rank=r, balance=model, micro_batches=2, window=4).indices() for r in range(2)
    ]
    dealt = np.concatenate(shares)
    assert dealt.size == 2 * -(-len(ds) // 2) and np.unique(dealt).tolist() == list(range(len(ds)))  # never loses
    first = loader(1)
    it = iter(first)
    seen = [next(it)["input_ids"].clone() for _ in range(3)]
    resumed = loader(1)
    resumed.load_state_dict(first.state_dict())
    rest = [b["input_ids"] for b in resumed]
    assert len(seen) + len(rest) == len(full)
    assert all(torch.equal(x, y) for x, y in zip(seen + rest, full, strict=True))
    mids = [PackedSampler(ds, num_replicas=2, rank=r, balance=model, micro_batches=2, window=4) for r in range(2)]
    taken = [x for m in mids for x in m.indices()[:2].tolist()]
    for m in mids:
        m.advance(2)  # mid-window: moves to 4 ranks too (tests/test_elastic_balance.py), losing and repeating nothing
    fours = [PackedSampler(ds, num_replicas=4, rank=r, balance=model, micro_batches=2, window=4) for r in range(4)]
    for f in fours:
        f.load_state_dict(mids[0].state_dict())
    rest = [x for f in fours for x in f]
    assert set(taken + rest) == set(range(len(ds))) and len(taken + rest) - len(ds) < 2 + 4


def test_a_state_from_another_blend_or_dataset_is_refused(stores):
    a = PackedSampler(BlendedDataset([(stores[0], 1), (stores[1], 2)]), num_replicas=2, rank=0)
    b = PackedSampler(BlendedDataset([(stores[0], 1), (stores[1], 3)]), num_replicas=2, rank=0)
    with pytest.raises(ConfigError, match="sampler state is of blend [0-9a-f]{16} but this sampler reads blend"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ConfigError, match="state is of blend .* reads a plain dataset"):
        PackedSampler(len(a.blend), num_replicas=2, rank=0).load_state_dict(a.state_dict())  # type: ignore[arg-type]


def test_bad_sources_are_one_line_errors(stores, tmp_path):
    other_size = make_store(tmp_path / "s32", 10, seed=1, size=32)
    other_tok = make_store(tmp_path / "tok", 10, seed=1, tokenizer={"name": "org/other", "sha256": "b" * 64})
    cases = [
        ([(tmp_path / "missing", 1)], "blend store .*missing does not exist"),
        ([(stores[0], 0)], "blend weight 0 of .* must be a finite number > 0"),
        ([(stores[0], -1)], "blend weight -1"),
        ([f"{stores[0]}:nan"], "blend weight nan"),
        ([f"{stores[0]}:inf"], "blend weight inf"),
        ([(stores[0], 1), (other_size, 1)], "blend stores must share one pack size"),
        ([(stores[0], 1), (other_tok, 1)], "blend stores must share one tokenizer"),
        ([], "a blend needs a list of sources"),
    ]
    pref = make_store(tmp_path / "pref", 10, seed=2)
    meta = metadata_for(pref, "training", SIZE)
    meta["preference"] = {"layout": "pairs", "pairs": 3}
    write_metadata_line(pref, meta)
    cases.append(([(stores[0], 1), (pref, 1)], "is a preference pack store .* blend plain pack stores only"))
    for spec, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            BlendedDataset(spec)
        assert "\n" not in str(info.value)


def test_cli_stats_reports_a_blend_and_refuses_bad_input(stores, tmp_path):
    code, out, err = cli("stats", f"{stores[0]}:1", f"{stores[1]}:2.5", f"{stores[2]}:0.5", "--seed", "3")
    assert code == 0, err
    ds = BlendedDataset([(stores[0], 1), (stores[1], 2.5), (stores[2], 0.5)], seed=3)
    assert f"blend of 3 pack stores, {len(ds)} samples per epoch" in out
    row = next(
        line
        for line in out.splitlines()
        if line.strip().startswith(str(stores[1])[-30:]) or str(stores[1])[-30:] in line
    )
    assert f" {int(ds.counts[1])} " in row and row.rstrip().endswith(f"{ds.counts[1] / ds.n_packs[1]:.4g}")
    code, out, _ = cli("stats", f"{stores[0]}:1", f"{stores[1]}:2.5", "--json")
    data = json.loads(out)
    two = BlendedDataset([(stores[0], 1), (stores[1], 2.5)])
    assert code == 0 and data["kind"] == "blend"
    assert [r["epochs"] for r in data["stores"]] == (two.counts / two.n_packs).tolist()
    assert [r["samples"] for r in data["stores"]] == two.counts.tolist()
    src, packs = two.index(0, len(two))  # tokens: the real tokens of exactly the packs the blend yields
    counts = [0, 0]
    for s_, j in zip(src.tolist(), packs.tolist(), strict=True):  # per pack, in Python: the reference
        split = open_pack_split(stores[s_], "training", SIZE)
        a, b = int(split.pack_offsets[j]), int(split.pack_offsets[j + 1])
        counts[s_] += int(split.seg_lens[a:b].sum() - split.seg_pad[a:b].sum())
    assert [r["tokens"] for r in data["stores"]] == counts
    assert abs(sum(r["sample_share"] for r in data["stores"]) - 1) < 1e-12
    assert "must be a finite number > 0" in cli_error("stats", f"{stores[0]}:0", f"{stores[1]}:1", code=2)
    assert "does not exist" in cli_error("stats", f"{stores[0]}:1", f"{tmp_path / 'nope'}:1")
    other = make_store(tmp_path / "s32", 10, seed=1, size=32)
    assert "share one pack size" in cli_error("stats", f"{stores[0]}:1", f"{other}:1")


def test_run_yaml_accepts_a_blend(stores, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(f"stats: {{blend: ['{stores[0]}:1', '{stores[3]}:0.5'], json: true}}\n")
    code, out, err = cli("run", str(config))
    assert code == 0, err
    assert '"kind": "blend"' in out
    config.write_text(f"stats: {{blend: ['{stores[0]}:0']}}\n")
    assert "must be a finite number > 0" in cli_error("run", str(config), code=2)
    config.write_text(f"stats: {{blend: [{{path: '{stores[0]}', weight: 2}}, '{stores[1]}'], json: true}}\n")
    code, out, err = cli("run", str(config))
    assert code == 0, err
    assert [r["weight"] for r in json.loads(out)["stores"]] == [2, 1]


def test_huge_plain_datasets_use_the_lazy_permutation(monkeypatch):
    import packtool.loader.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "LAZY_ABOVE", 100)
    n, world = 1000, 3
    samplers = [PackedSampler(n, num_replicas=world, rank=r, seed=2) for r in range(world)]
    assert samplers[0].order_kind == "feistel-v1" and samplers[0]._perm is None
    shares = [list(s) for s in samplers]
    assert [s.indices().tolist() for s in samplers] == shares
    flat = [shares[r][k] for k in range(len(shares[0])) for r in range(world)]
    assert sorted(flat[:n]) == list(range(n)) and flat[:5] != list(range(5))
    samplers[0].set_epoch(1)
    assert list(samplers[0]) != shares[0]
    monkeypatch.setattr(sampler_module, "LAZY_ABOVE", 1 << 26)
    with pytest.raises(ConfigError, match="order='feistel-v1' but this sampler has 'numpy'"):
        PackedSampler(n, num_replicas=world, rank=0, seed=2).load_state_dict(samplers[1].state_dict())


def test_a_blend_crosses_dataloader_workers(stores):
    ds = BlendedDataset([(stores[0], 1), (stores[2], 2)], seed=0, max_open=1)  # the LRU re-opens stores
    sampler = PackedSampler(ds, num_replicas=1, rank=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=PackedCollator())
    got = torch.cat([b["input_ids"] for b in loader])
    want = torch.cat(
        [
            PackedCollator()(ds.__getitems__(list(range(a, min(a + 4, len(ds))))))["input_ids"]
            for a in range(0, len(ds), 4)
        ]
    )
    assert torch.equal(got, want)


@pytest.mark.slow
def test_ten_thousand_stores_open_fast_and_small(stores, tmp_path):
    """10,000 real pack stores (hard links to one store's files, each with its own metadata file)."""
    import os
    import time

    links = []
    for i in range(10_000):
        d = tmp_path / f"s{i:05d}"
        d.mkdir()
        for f in stores[1].iterdir():
            os.link(f, d / f.name)
        links.append((d, 0.5 + (i % 5) / 4))

    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before, t = rss(), time.perf_counter()
    ds = BlendedDataset(links, seed=0)
    seconds, grown = time.perf_counter() - t, rss() - before
    assert seconds < 10 and grown < 2**30, (seconds, grown)
    n = int(ds.n_packs[0])
    assert len(ds) == sum(math.floor(w) * n + math.floor((w - math.floor(w)) * n + 0.5) for _, w in links)
    sampler = PackedSampler(ds, num_replicas=1000, rank=3)
    sampler.load_state_dict({**sampler.state_dict(), "num_replicas": 500, "consumed": len(ds) // 1000})
    t = time.perf_counter()
    first = next(iter(sampler))
    assert time.perf_counter() - t < 1 and first == len(ds) // 1000 * 500 + 3
    item = ds[first]
    assert torch.equal(item["input_ids"], PackedDataset(stores[1])[item["source_index"]]["input_ids"])


def test_a_balanced_blend_prices_packs_without_opening_a_store(stores):
    """Pricing a window opened every store it drew from (every check, nine memory maps): 17-58 s a window at
    10,000 stores. The costs now come from each store's pack_offsets/seg_lens read in place, equal to the
    costs of the store's own segment table, and no store is opened until a pack is read."""
    from packtool.loader.sampler_costs import costs_of

    ds = BlendedDataset([(stores[0], 1), (stores[1], 2.5), (stores[2], 3), (stores[3], 0.4)], seed=1)
    model = CostModel.from_shape(256)
    sampler = PackedSampler(ds, num_replicas=3, rank=1, balance=model, micro_batches=2, window=4)
    dealt = sampler.indices()
    assert dealt.size and not ds._open and not ds._layouts  # priced, nothing opened
    rng = np.random.default_rng(0)
    sources = ds.index(0, len(ds))[0]
    for s in range(len(stores)):
        packs = rng.integers(0, int(ds.n_packs[s]), 300)  # unsorted, repeated, far apart and adjacent
        counts, lens = ds.segment_lengths(s, packs)
        po, table = ds.segment_table(s)
        assert counts.tolist() == (po[packs + 1] - po[packs]).tolist()
        want = np.concatenate([table[po[p] : po[p + 1]] for p in packs]).astype(np.int64)
        assert lens.tolist() == want.tolist()
        keys = np.flatnonzero(sources == s)[:50]
        _, their_packs = ds.locate(keys)
        np.testing.assert_allclose(sampler._pack_costs(keys), costs_of(model, po, table, None, their_packs), rtol=0)
    assert ds.segment_lengths(0, np.zeros(0, np.int64))[0].size == 0


def test_pricing_a_damaged_store_is_one_error(stores, tmp_path):
    import shutil

    from packtool.errors import FormatError

    copies = [tmp_path / f"c{i}" for i in range(2)]
    for src, dst in zip(stores[:2], copies, strict=True):
        shutil.copytree(src, dst)
    ds = BlendedDataset([(copies[0], 1), (copies[1], 1)], seed=0)
    lens_file = next(copies[1].glob("training_*seg_lens*.npy"))
    lens_file.write_bytes(lens_file.read_bytes()[:-8])  # cut short
    with pytest.raises(FormatError, match=r"is truncated .*re-run `packtool pack`"):
        ds.segment_lengths(1, np.arange(int(ds.n_packs[1])))
    offsets = next(copies[0].glob("training_*pack_offsets*.npy"))
    n0, n_seg = int(ds.n_packs[0]), open_pack_split(copies[0], "training", SIZE).seg_lens.size
    table = np.tile([0, n_seg], n0 // 2 + 1)[: n0 + 1]  # even packs each claim every segment (odd ones < 0)
    np.save(offsets, table.astype(np.int64))
    with pytest.raises(FormatError, match=r"pack_offsets is inconsistent with \d+ segments"):
        ds.segment_lengths(0, np.arange(0, n0, 2))  # refused before n0/2 x n_seg entries are gathered
    np.save(offsets, np.arange(5, dtype=np.int64))  # another store's table now
    with pytest.raises(FormatError, match=r"pack_offsets.npy is truncated, .*re-run `packtool pack`"):
        ds.segment_lengths(0, np.array([0]))  # its header was read before: shorter than it said
    with pytest.raises(FormatError, match=r"now holds 4 packs, the blend was opened with \d+.*re-open the blend"):
        BlendedDataset([(copies[0], 1), (copies[1], 1)], seed=0).segment_lengths(0, np.array([0]))
